"""Never a false end: a replica that breaks a stream mid-way, through a real gateway process.

The replica (an in-test aiohttp server on loopback) sends one event, then breaks: the connection drops
mid-event, or an invalid chunk-size line arrives and the connection stays open. Whatever the usage option
(the client's own `include_usage`, or the usage the gateway asks for and strips) and whether the stream
is chunked in phrases, the client must read an error event and `data: [DONE]` soon after, never a clean
end without them. An event too large to hold (over 1 MiB, relayed as it comes) cannot be followed by
an event: the connection is closed without the chunked terminator, so the client sees a broken answer.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.gateway_procs import MODEL, Gateway, pool, running, start_gateway
from tests.integration.reliability_tools import DONE, Outcome, report
from tests.upstream import FakeReplica, ThreadServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, FakeReplica]]:
    fake = FakeReplica("breaking", chunks=4, die_after=1)
    with ThreadServer(fake.app) as url, running() as track:
        gateway = track(
            start_gateway(
                tmp_path_factory.mktemp("truncated"),
                {MODEL: pool(("breaking", url))},
                limits={"max_retries": 0},
                load={"enabled": False},
                health={"interval_s": 5.0, "eject_after_failures": 1000},
                timeouts={"connect_s": 1.0, "first_byte_s": 10.0, "idle_s": 10.0},
            )
        )
        yield gateway, fake


def _stream(gateway: Gateway, usage: bool, phrase: bool) -> tuple[Outcome, float]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": 8,
        **({"stream_options": {"include_usage": True}} if usage else {}),
    }
    out, started = Outcome(), time.monotonic()
    try:
        with httpx.stream(
            "POST",
            f"{gateway.url}/v1/chat/completions",
            json=body,
            timeout=20,
            headers={"X-Stream-Chunking": "phrase"} if phrase else {},
        ) as resp:
            out.status = resp.status_code
            for data in resp.iter_raw():
                out.body += data
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    return out, time.monotonic() - started


@pytest.mark.parametrize("phrase", [False, True], ids=["plain", "phrase"])
@pytest.mark.parametrize("usage", [True, False], ids=["include_usage", "stripped_usage"])
@pytest.mark.parametrize("fault", ["mid_event", "bad_chunk"])
def test_broken_stream_ends_with_error_event_and_done(
    cluster: tuple[Gateway, FakeReplica], fault: str, usage: bool, phrase: bool
) -> None:
    gateway, fake = cluster
    fake.mid_event, fake.bad_chunk = fault == "mid_event", fault == "bad_chunk"
    out, took_s = _stream(gateway, usage, phrase)
    report(f"broken stream {fault} usage={usage} phrase={phrase}", [out], took_s=round(took_s, 2))
    assert out.status == 200 and not out.error, out
    assert out.stream_error_event, out.body[-300:]
    assert b': {"cont' not in out.body, "half an event reached the client"
    assert took_s < 5, took_s  # the gateway ended it at once, not after a timeout
    logged = gateway.proc.output()
    assert "Traceback" not in logged and "RuntimeError" not in logged, logged[-3000:]


def test_oversized_event_broken_closes_without_terminator(cluster: tuple[Gateway, FakeReplica]) -> None:
    """An event over 1 MiB is relayed as it comes, so the gateway cannot follow its broken half with an error
    event: the client must see a broken chunked answer, not a complete one."""
    gateway, fake = cluster
    fake.mid_event, fake.bad_chunk, fake.mid_event_pad = True, False, 3 << 19  # 1.5 MiB of the broken event
    try:
        out, _ = _stream(gateway, usage=True, phrase=False)
    finally:
        fake.mid_event_pad = 0
    report("broken oversized event", [out])
    assert out.status == 200 and out.error, (out.error, out.body[-200:])  # httpx: the chunked body was cut
    assert not out.body.endswith(DONE)
