"""Failover and the circuit breaker over real processes: a replica SIGKILLed under 50 live streams."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import aiohttp
import httpx
import pytest

from tests.integration.gateway_procs import MODEL, pool, running, start_gateway, start_stub
from tests.integration.reliability_tools import Load, chat, eventually, metric, report, streaming

pytestmark = pytest.mark.timeout(90)
STREAMS = 100  # round robin over two replicas: 50 run through the one that dies


def test_replica_killed_under_50_streams(tmp_path: Path) -> None:
    """Every stream ends cleanly (the dead replica's with an error event and [DONE]), none hangs, and
    every request that had not started streaming succeeds, also those sent right after the kill."""
    with running() as track:
        # The victim decodes at a quarter of the survivor's pace: its 120-token answers take about 15 s, so
        # none can end before the kill however slowly the 100 streams start on a loaded machine.
        victim, survivor = track(start_stub("victim", speedup=0.5)), track(start_stub("survivor", speedup=2))
        gateway = track(
            start_gateway(
                tmp_path,
                {MODEL: pool(("victim", victim.url), ("survivor", survivor.url))},
                health={
                    "interval_s": 0.1,
                    "timeout_s": 0.5,
                    "unhealthy_after": 1,
                    "eject_after_failures": 3,
                    "failure_window_s": 5.0,
                    "backoff_s": 1.0,
                    "backoff_max_s": 2.0,
                },
            )
        )
        load = Load(gateway.url, timeout_s=30)
        after = Load(gateway.url, timeout_s=30)

        async def scenario() -> None:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                streams = await streaming(load, session, STREAMS, max_tokens=120)
                assert victim.proc is not None
                victim.proc.kill()  # SIGKILL: the sockets of 50 live streams are reset
                fresh = [after.one(session, chat(f"after {i}", stream=i % 2 == 0)) for i in range(20)]
                await asyncio.gather(*streams, *fresh)

        asyncio.run(scenario())
        by_replica = Counter(o.replica for o in load.outcomes)
        assert by_replica == {"victim": 50, "survivor": 50}
        hung = [o for o in load.outcomes + after.outcomes if o.error]
        assert not hung, hung[:3]
        cut = [o for o in load.outcomes if o.replica == "victim"]
        torn = [(o.status, o.body[-160:]) for o in cut if not (o.status == 200 and o.stream_error_event)]
        assert not torn, f"a well-formed end, not a torn stream: {len(torn)} of {len(cut)}, e.g. {torn[:2]}"
        assert all(o.clean and not o.stream_error_event for o in load.outcomes if o.replica == "survivor")
        assert all(o.clean for o in after.outcomes), [(o.status, o.body[:200]) for o in after.outcomes]
        assert {o.replica for o in after.outcomes} == {"survivor"}, "new requests route around the dead replica"
        report(
            "replica killed under 50 streams",
            load.outcomes + after.outcomes,
            cut_with_error_event=len(cut),
            served_after_kill=len(after.outcomes),
        )
        opened = 'affinity_gateway_replica_breaker_opened_total{model_name="stub-model",replica="victim"}'
        assert metric(gateway, opened)
        eventually(
            lambda: gateway.replicas()["victim"]["in_flight"] == 0 and gateway.replicas()["survivor"]["in_flight"] == 0,
            timeout_s=5,
        )
        victim.start()  # the breaker half-opens after its backoff and one trial request closes it
        eventually(lambda: gateway.replicas()["victim"]["available"], timeout_s=10)
        with httpx.Client(base_url=gateway.url, timeout=10) as http:
            seen = Counter(http.post("/v1/chat/completions", json=chat()).headers["X-Replica-Id"] for _ in range(6))
        assert seen["victim"] >= 2 and gateway.replicas()["victim"]["breaker"] == "closed"
