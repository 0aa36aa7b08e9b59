"""No buffering: each chunk reaches the client before the replica sends the next one.

The replica is an in-test aiohttp server (own thread) that sends one SSE event, then waits for the
test to say "got it" before sending the next; a buffering gateway would deadlock here and time out.
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from tests.integration.gateway_procs import MODEL, pool, running, start_gateway
from tests.upstream import FakeReplica, ThreadServer


def test_each_chunk_arrives_before_the_next_is_sent(tmp_path: Path) -> None:
    fake = FakeReplica("paused", chunks=4, hold=threading.Event())
    assert fake.hold is not None
    with ThreadServer(fake.app) as url, running() as track:
        gateway = track(start_gateway(tmp_path, {MODEL: pool(("paused", url))}, load={"enabled": False}))
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        received, released = b"", 0
        with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body, timeout=10) as resp:
            assert resp.status_code == 200 and resp.headers["content-type"] == "text/event-stream"
            for data in resp.iter_raw():
                received += data
                while released < fake.chunks - 1 and f"tok{released} ".encode() in received:
                    assert f"tok{released + 1} ".encode() not in received, "sent before being released"
                    released += 1
                    fake.hold.set()  # release chunk i+1 only now that chunk i arrived
        assert released == fake.chunks - 1
        # the chunks and [DONE]: the fake's usage event was not asked for, so it is dropped
        assert received.count(b"data: ") == fake.chunks + 1 and received.endswith(b"data: [DONE]\n\n")
