"""Usage numbers a replica reports are clamped to what is possible, through a real gateway process.

A replica that lies about its token counts (an in-test aiohttp server on loopback) must not turn a finished
answer into a 500 (negative counts), nor lock its tenant out for ages (a count of 10**15 charged to the
key's token rate). Counts below zero read as not reported; counts above the request's `max_tokens`, the
model's `max_model_len` or, knowing neither, `gateway.request.usage.MAX_TOKENS`, read as that bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.edge.auth import hash_key
from tests.integration.gateway_procs import MODEL, Gateway, pool, running, start_gateway
from tests.integration.reliability_tools import chat, eventually, report
from tests.upstream import FakeReplica, ThreadServer

pytestmark = pytest.mark.timeout(60)

KEY = "sk-usage-bounds"
HEADERS = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, FakeReplica]]:
    fake = FakeReplica("liar", models={MODEL: 4096})
    keys = [{"sha256": hash_key(KEY), "tenant": "acme", "tokens_per_minute": 100_000}]
    with ThreadServer(fake.app) as url, running() as track:
        gateway = track(
            start_gateway(
                tmp_path_factory.mktemp("usage"),
                {MODEL: pool(("liar", url))},
                auth={"keys": keys},
                limits={"max_retries": 0},
                health={"interval_s": 0.2, "eject_after_failures": 1000},
            )
        )
        eventually(lambda: _max_model_len(gateway) == 4096)
        yield gateway, fake


def _max_model_len(gateway: Gateway) -> Any:
    listed = httpx.get(f"{gateway.url}/v1/models", headers=HEADERS, timeout=5).json()["data"]
    return next((m.get("max_model_len") for m in listed if m["id"] == MODEL), None)


def _ask(gateway: Gateway, stream: bool, **extra: Any) -> httpx.Response:
    body = chat("count me", max_tokens=16, stream=stream, **extra)
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=HEADERS, timeout=20)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": -5, "completion_tokens": 3, "total_tokens": -2},
        {"prompt_tokens": 7, "completion_tokens": -1, "prompt_tokens_details": {"cached_tokens": -9}},
    ],
    ids=["negative_prompt", "negative_completion"],
)
def test_negative_usage_is_not_a_500(cluster: tuple[Gateway, FakeReplica], usage: dict[str, Any], stream: bool) -> None:
    gateway, fake = cluster
    fake.usage = usage
    try:
        answers = [_ask(gateway, stream) for _ in range(3)]
    finally:
        fake.usage = None
    report(f"negative usage {usage} stream={stream}", [], statuses=[a.status_code for a in answers])
    assert [a.status_code for a in answers] == [200] * 3, answers[0].text[:300]
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    assert "-5.0" not in metrics and "-1.0" not in metrics


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_absurd_completion_tokens_do_not_lock_the_tenant_out(
    cluster: tuple[Gateway, FakeReplica], stream: bool
) -> None:
    gateway, fake = cluster
    fake.usage = {"prompt_tokens": 7, "completion_tokens": 10**15, "total_tokens": 10**15 + 7}
    try:
        first = _ask(gateway, stream, stream_options={"include_usage": True} if stream else None)
    finally:
        fake.usage = None
    assert first.status_code == 200, first.text[:300]
    after = _ask(gateway, False)
    report(
        f"absurd usage stream={stream}",
        [],
        status_after=after.status_code,
        retry_after=after.headers.get("Retry-After"),
    )
    assert after.status_code == 200, (after.status_code, after.headers.get("Retry-After"), after.text[:200])
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    line = next(
        x for x in metrics.splitlines() if x.startswith('affinity_gateway_tenant_tokens_total{kind="completion"')
    )
    assert float(line.rsplit(" ", 1)[1]) < 10**6, line
