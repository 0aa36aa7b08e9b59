"""Whole (non-streamed) answers are bounded, through a real gateway process and an in-test replica.

A replica answering 50 MiB to a non-streamed request, with `limits.max_answer_bytes` at 8 MiB, must cost
the gateway less than twice the limit in memory (its peak RSS, VmHWM, against its RSS before) and give
the client a clear 502 in the OpenAI shape, whether the replica said its Content-Length or sent the body
chunked without one. Before: the body was read whole (`upstream.read()`) and sent on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.gateway_procs import MODEL, Gateway, pool, running, start_gateway
from tests.integration.reliability_tools import chat, report
from tests.upstream import FakeReplica, ThreadServer

pytestmark = pytest.mark.timeout(90)

LIMIT = 8 * 1024 * 1024
HUGE = 50 * 1024 * 1024


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, FakeReplica]]:
    fake = FakeReplica("huge")
    with ThreadServer(fake.app) as url, running() as track:
        gateway = track(
            start_gateway(
                tmp_path_factory.mktemp("whole"),
                {MODEL: pool(("huge", url))},
                limits={"max_retries": 1, "max_answer_bytes": LIMIT},
                health={"interval_s": 5.0, "eject_after_failures": 1000},
            )
        )
        yield gateway, fake


def _status_kb(gateway: Gateway, field: str) -> int:
    status = Path(f"/proc/{gateway.proc.popen.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith(field + ":")))


@pytest.mark.parametrize("chunked", [False, True], ids=["content_length", "chunked"])
def test_huge_whole_answer_is_a_clear_502_within_twice_the_limit(
    cluster: tuple[Gateway, FakeReplica], chunked: bool
) -> None:
    gateway, fake = cluster
    assert httpx.post(f"{gateway.url}/v1/chat/completions", json=chat(), timeout=20).status_code == 200
    before_kb = _status_kb(gateway, "VmRSS")
    fake.answer_bytes, fake.chunked, fake.drip_pieces = HUGE, chunked, HUGE // 65536
    try:
        answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat("big"), timeout=60)
    finally:
        fake.answer_bytes, fake.chunked, fake.drip_pieces = 0, False, 10
    rise_mb = (_status_kb(gateway, "VmHWM") - before_kb) / 1024
    report(
        f"whole answer of 50 MiB, limit 8 MiB, chunked={chunked}",
        [],
        status=answer.status_code,
        answer_bytes=len(answer.content),
        peak_rss_rise_mb=round(rise_mb, 1),
    )
    assert answer.status_code == 502, (answer.status_code, len(answer.content))
    error = answer.json()["error"]
    assert error["type"] == "BadGatewayError" and "max_answer_bytes" in error["message"], error
    assert rise_mb < 2 * LIMIT / 2**20, f"peak RSS rose {rise_mb:.1f} MB"
    after = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat(), timeout=20)
    assert after.status_code == 200, "the gateway serves on"


def test_slow_but_moving_whole_body_is_not_cut_as_silent(tmp_path: Path) -> None:
    """A whole body arriving in 8 pieces 0.3 s apart (2.1 s in all) with `idle_s` 1: never silent for 1 s,
    so served by the first replica. Before: cut as "no byte for 1s" and done again on the other one."""
    fakes = (FakeReplica("drip-a", drip_s=0.3, drip_pieces=8), FakeReplica("drip-b", drip_s=0.3, drip_pieces=8))
    with ThreadServer(fakes[0].app) as url_a, ThreadServer(fakes[1].app) as url_b, running() as track:
        gateway = track(
            start_gateway(
                tmp_path,
                {MODEL: pool(("drip-a", url_a), ("drip-b", url_b))},
                limits={"max_retries": 1},
                health={"interval_s": 5.0, "eject_after_failures": 1000},
                timeouts={"connect_s": 1.0, "first_byte_s": 5.0, "idle_s": 1.0},
            )
        )
        answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat("slow"), timeout=30)
        tried = sum(len(f.seen) for f in fakes)
        report("whole body 1 piece / 0.3 s, idle_s 1", [], status=answer.status_code, replicas_tried=tried)
        assert answer.status_code == 200, answer.text[:300]
        assert tried == 1, "the body was moving: no replica should have done the work again"
