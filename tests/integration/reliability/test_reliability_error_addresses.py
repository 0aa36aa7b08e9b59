"""No internal addresses in error bodies when `headers.replica_id` is off, through a real gateway process.

Replicas configured by URL alone are named by their address (`127.0.0.1:port`), and the gateway's error
messages name the replica that failed. With `headers.replica_id: false` the operator hides which replica
answered: a 502 / 503 / 504 body (or a stream's error event) must then name no address, no URL and no
replica, while the log keeps them. Cases: a replica that breaks off a whole answer, one that refuses the
connection, one that resets the request on two replicas (poison).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers import free_port
from tests.integration.gateway_procs import MODEL, Gateway, running, start_gateway
from tests.integration.reliability_tools import chat, report
from tests.upstream import FakeReplica, ThreadServer

pytestmark = pytest.mark.timeout(60)

_ADDRESS = re.compile(r"127\.0\.0\.1|localhost|:\d{4,5}\b|https?://")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, FakeReplica, FakeReplica]]:
    a, b = FakeReplica("a", poison="POISON"), FakeReplica("b", poison="POISON")
    with ThreadServer(a.app) as url_a, ThreadServer(b.app) as url_b, running() as track:
        dead = f"http://127.0.0.1:{free_port()}"
        gateway = track(
            start_gateway(
                tmp_path_factory.mktemp("addresses"),
                {
                    MODEL: {"replicas": [{"url": url_a}, {"url": url_b}], "routing": {"policy": "round_robin"}},
                    "dead-model": {"replicas": [{"url": dead}], "routing": {"policy": "round_robin"}},
                },
                headers={"replica_id": False},
                limits={"max_retries": 1},
                health={"interval_s": 5.0, "eject_after_failures": 1000},
            )
        )
        yield gateway, a, b


def _post(gateway: Gateway, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=20)


def test_error_bodies_name_no_address(cluster: tuple[Gateway, FakeReplica, FakeReplica]) -> None:
    gateway, a, b = cluster
    answers = {"poison": _post(gateway, chat("POISON"))}
    answers["refused"] = _post(gateway, {**chat(), "model": "dead-model"})
    a.partial = b.partial = "close"
    try:
        answers["broken"] = _post(gateway, chat("half"))
    finally:
        a.partial = b.partial = None
    report(
        "error bodies with replica_id off",
        [],
        **{kind: f"{r.status_code}:{r.json()['error']['message']}" for kind, r in answers.items()},
    )
    for kind, answer in answers.items():
        assert answer.status_code >= 500 and "error" in answer.json(), (kind, answer.text)
        assert not _ADDRESS.search(answer.text), (kind, answer.text)
    assert "127.0.0.1" in gateway.proc.output(), "the log still names the replicas"
