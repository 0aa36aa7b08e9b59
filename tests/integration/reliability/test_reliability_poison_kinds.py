"""Query of death by reset or stall, through a real gateway process: a request that makes every replica drop
the connection without answering, or send nothing past `timeouts.first_byte_s`, must not open breakers.

The replicas are in-test aiohttp servers on loopback (`FakeReplica(poison=MARKER, poison_mode=...)`): a
request whose body holds the marker is reset or stalled, every other one is answered at once. One such
request a second for `SECONDS` while 4 clients run steady traffic (issue 37 asks for 20 s; 10 s per case
keeps both cases within 30 s, and 10 poison requests already give 20-30 breaker faults against a
threshold of 3 before the fix).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import httpx
import orjson
import pytest

from tests.integration.gateway_procs import MODEL, pool, running, start_gateway
from tests.integration.reliability_tools import Load, chat, metric, report, steady_clients
from tests.upstream import FakeReplica, ThreadServer

pytestmark = pytest.mark.timeout(60)
SECONDS = 10
INNOCENT_CLIENTS = 4
MARKER = "query-of-death"
FIRST_BYTE_S = 1.0


async def _scenario(url: str, innocent: Load, bad: Load) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        stop = asyncio.Event()

        clients = steady_clients(session, innocent, INNOCENT_CLIENTS, stop)
        poison = []
        for i in range(SECONDS):
            body = chat(f"{MARKER} {i}", stream=i % 2 == 0)
            poison.append(asyncio.create_task(bad.one(session, body, headers={"X-Request-Id": f"poison-{i}"})))
            await asyncio.sleep(1.0)
        await asyncio.gather(*poison)
        stop.set()
        await asyncio.gather(*clients)


@pytest.mark.parametrize("mode", ["reset", "stall"])
def test_query_of_death_by_reset_or_stall_opens_no_breaker(tmp_path: Path, mode: str) -> None:
    fakes = [FakeReplica(f"r{i}", poison=MARKER, poison_mode=mode) for i in range(3)]
    servers = [ThreadServer(fake.app) for fake in fakes]
    urls = [server.__enter__() for server in servers]
    try:
        with running() as track:
            gateway = track(
                start_gateway(
                    tmp_path,
                    {MODEL: pool(*((f.replica_id, u) for f, u in zip(fakes, urls)))},
                    health={
                        "interval_s": 0.2,
                        "timeout_s": 1.0,
                        "unhealthy_after": 2,
                        "eject_after_failures": 3,
                        "failure_window_s": 30.0,
                        "backoff_s": 5.0,
                        "backoff_max_s": 10.0,
                    },
                    limits={"max_retries": 2},
                    timeouts={"connect_s": 1.0, "first_byte_s": FIRST_BYTE_S, "idle_s": 10.0},
                )
            )
            innocent, bad = Load(gateway.url, timeout_s=30), Load(gateway.url, timeout_s=30)
            started = time.monotonic()
            asyncio.run(_scenario(gateway.url, innocent, bad))
            took_s = time.monotonic() - started
            replicas = gateway.replicas().values()
            failed = [(o.status, o.error, o.body[:120]) for o in innocent.outcomes if not o.clean]
            tried = sum(MARKER.encode() in seen.body for fake in fakes for seen in fake.seen)
            slowest = max(o.first_byte_s or 99.0 for o in bad.outcomes)
            report(
                f"query of death by {mode}",
                innocent.outcomes,
                bad_sent=len(bad.outcomes),
                innocent_failed=len(failed),
                bad_statuses=sorted({o.status for o in bad.outcomes}),
                upstream_tries=tried,
                slowest_bad_s=round(slowest, 2),
                breaker_openings=sum(r["breaker_opened"] for r in replicas),
                took_s=round(took_s, 1),
            )
            assert len(innocent.outcomes) > 100, len(innocent.outcomes)
            assert len(failed) <= len(innocent.outcomes) // 100, failed[:5]
            assert all(r["breaker"] == "closed" and r["breaker_opened"] == 0 for r in replicas), [
                (r["id"], r["breaker"], r["breaker_opened"]) for r in replicas
            ]
            status = 502 if mode == "reset" else 504
            assert [o.status for o in bad.outcomes] == [status] * SECONDS, [
                (o.status, o.body[:200]) for o in bad.outcomes
            ]
            for outcome in bad.outcomes:  # a clear answer in the OpenAI shape, naming what happened
                error = orjson.loads(outcome.body)["error"]
                assert error["code"] == status and "two replicas" in error["message"], error
            assert slowest < (2 * FIRST_BYTE_S + 1.5 if mode == "stall" else 1.5), slowest
            assert tried == 2 * SECONDS, "a poison request is tried on two replicas, never a third"
            assert metric(gateway, "affinity_gateway_poison_requests_total") == SECONDS
            logged = gateway.proc.output()
            assert all(f"poison-{i}" in logged for i in range(SECONDS)) and "poison_request" in logged
            assert httpx.get(f"{gateway.url}/ready", timeout=5).status_code == 200
    finally:
        for server in servers:
            server.__exit__()
