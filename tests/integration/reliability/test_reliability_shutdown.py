"""Graceful shutdown: SIGTERM stops new work, lets accepted requests finish, then exits; and a
rolling restart of the two gateways behind a front gateway loses no request.

The rolling-restart client never retries: every request it sends must come back complete. Requests
reach the back gateways through a front gateway (the product's own pre-first-byte failover stands
in for a load balancer), whose probes use the back gateways' /ready, which turns 503 on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

import aiohttp
import httpx
import pytest

from tests.integration.gateway_procs import MODEL, pool, running, start_gateway, start_stub
from tests.integration.reliability_tools import (
    Load,
    Outcome,
    chat,
    eventually,
    metric,
    post_until,
    replica_running,
    report,
    restart_gateway,
)

pytestmark = pytest.mark.timeout(120)


def _refused(url: str) -> bool:
    try:
        httpx.get(f"{url}/health", timeout=1)
    except httpx.ConnectError:
        return True
    return False


def test_sigterm_drains_accepted_streams_then_exits(tmp_path: Path) -> None:
    with running() as track:
        stub = track(start_stub("only", speedup=2))
        gateway = track(
            start_gateway(tmp_path, {MODEL: pool(("only", stub.url))}, shutdown={"grace_s": 20.0, "ready_delay_s": 0.5})
        )
        load = Load(gateway.url, timeout_s=30)
        ready_while_draining: list[int] = []

        async def scenario() -> None:
            async with aiohttp.ClientSession() as session:
                streams = [
                    asyncio.create_task(load.one(session, chat(f"s{i}", max_tokens=60, stream=True))) for i in range(6)
                ]
                while sum(o.first_byte_s is not None for o in load.outcomes) < 6:
                    await asyncio.sleep(0.02)
                gateway.proc.popen.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.2)
                async with session.get(f"{gateway.url}/ready") as resp:  # still listening: ready delay
                    ready_while_draining.append(resp.status)
                await asyncio.gather(*streams)

        signalled = time.monotonic()
        asyncio.run(scenario())
        assert ready_while_draining == [503]
        assert all(o.clean and not o.stream_error_event for o in load.outcomes), load.outcomes
        assert _refused(gateway.url), "no new connections once draining"
        gateway.proc.popen.wait(20)
        report(
            "sigterm drain",
            load.outcomes,
            exit_code=gateway.proc.popen.returncode,
            drained_in_s=round(time.monotonic() - signalled, 2),
        )
        assert gateway.proc.popen.returncode == 0


@pytest.mark.parametrize("grace_s", [1.0, 3.0])
def test_sigterm_grace_deadline_ends_what_is_left(tmp_path: Path, grace_s: float) -> None:
    """The process exits within ready_delay_s + grace_s + 1 s, and a stream still running at the end of
    the grace period ends with the SSE error event and [DONE] (on main: cut bare at ready + 2 x grace)."""
    ready_delay_s = 0.5
    with running() as track:
        stub = track(start_stub("only", speedup=1))
        gateway = track(
            start_gateway(
                tmp_path,
                {MODEL: pool(("only", stub.url))},
                shutdown={"grace_s": grace_s, "ready_delay_s": ready_delay_s},
            )
        )
        with httpx.stream(
            "POST", f"{gateway.url}/v1/chat/completions", json=chat(max_tokens=1000, stream=True), timeout=15
        ) as resp:
            chunks = resp.iter_raw()
            body = next(chunks)
            assert body.startswith(b"data: ")
            signalled = time.monotonic()
            gateway.proc.popen.send_signal(signal.SIGTERM)
            for chunk in chunks:
                body += chunk
            ended_s = time.monotonic() - signalled
        gateway.proc.popen.wait(15)
        drained_s = time.monotonic() - signalled
        out = Outcome(status=resp.status_code, body=body)
        report(
            f"sigterm grace deadline, grace_s={grace_s}",
            [out],
            stream_ended_s=round(ended_s, 2),
            drained_in_s=round(drained_s, 2),
            exit_code=gateway.proc.popen.returncode,
        )
        assert out.stream_error_event, body[-300:]
        assert drained_s <= ready_delay_s + grace_s + 1.0, drained_s
        assert gateway.proc.popen.returncode == 0
        eventually(lambda: replica_running(stub) == 0, timeout_s=2)


@pytest.mark.parametrize("ready_delay_s", [0.4, 0.0], ids=["ready-delay", "no-delay"])
def test_rolling_restart_of_two_gateways_loses_no_request(tmp_path: Path, ready_delay_s: float) -> None:
    """With a ready delay the front stops sending before the port closes; without one it meets
    refused connections and resets on idle keep-alive connections, and fails over before any byte."""
    outcomes: list[Outcome] = []
    stop = threading.Event()

    def client(url: str, n: int) -> None:
        post_until(url, stop, outcomes, lambda i: chat(f"c{n} r{i}", max_tokens=20, stream=i % 2 == 0))

    with running() as track:
        stubs = [track(start_stub(f"replica-{i}", speedup=4)) for i in range(2)]
        backs = [
            track(
                start_gateway(
                    tmp_path,
                    {MODEL: pool(*((s.replica_id, s.url) for s in stubs))},
                    shutdown={"grace_s": 20.0, "ready_delay_s": ready_delay_s},
                )
            )
            for _ in range(2)
        ]
        front = track(
            start_gateway(
                tmp_path,
                {MODEL: pool(("back-0", backs[0].url), ("back-1", backs[1].url))},
                health={
                    "path": "/ready",
                    "interval_s": 0.1,
                    "timeout_s": 0.5,
                    "unhealthy_after": 1,
                    "healthy_after": 1,
                },
            )
        )
        threads = [threading.Thread(target=client, args=(front.url, n)) for n in range(4)]
        for t in threads:
            t.start()
        try:
            time.sleep(1.0)
            for back in backs:
                restart_gateway(back)
                eventually(lambda back=back: front.replicas()[f"back-{backs.index(back)}"]["available"], timeout_s=10)
                time.sleep(0.5)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        retried = metric(front, f'affinity_gateway_retries_total{{model_name="{MODEL}"}}') or 0
    report(f"rolling restart of two gateways, ready_delay_s={ready_delay_s}", outcomes, front_retries=retried)
    assert len(outcomes) > 40
    bad = [o for o in outcomes if not o.clean or o.stream_error_event]
    assert not bad, bad[:3]
