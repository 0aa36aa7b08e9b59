"""Query of death over real processes: a request every replica answers with 5xx must not open breakers.

The trigger is a marker in the prompt that the stubs answer with 500 (`--fail-on-marker`: an input-dependent
5xx, as a real engine's bug would give).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from tests.integration.gateway_procs import MODEL, pool, running, start_gateway, start_stub
from tests.integration.reliability_tools import Load, metric, report, steady_clients

pytestmark = pytest.mark.timeout(120)
SECONDS = 8  # one bad request per second for this long
INNOCENT_CLIENTS = 4


MARKER = "query-of-death"


def _bad(i: int) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": f"{MARKER} {i}"}]}


def test_sustained_query_of_death(tmp_path: Path) -> None:
    """One client sends a bad request per second while others run steady traffic: every bad request gets the
    replica's 5xx after two replicas (never a third), no innocent request fails and no breaker opens."""
    with running() as track:
        stubs = [track(start_stub(f"r{i}", MODEL, 50, "--fail-on-marker", MARKER)) for i in range(3)]
        gateway = track(
            start_gateway(
                tmp_path,
                {MODEL: pool(*((s.replica_id, s.url) for s in stubs))},
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
            )
        )
        innocent, bad = Load(gateway.url, timeout_s=30), Load(gateway.url, timeout_s=30)

        async def scenario() -> None:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                stop = asyncio.Event()

                clients = steady_clients(session, innocent, INNOCENT_CLIENTS, stop)
                for i in range(SECONDS):
                    await bad.one(session, _bad(i), headers={"X-Request-Id": f"poison-{i}"})
                    await asyncio.sleep(1.0)
                stop.set()
                await asyncio.gather(*clients)

        asyncio.run(scenario())
        failed = [(o.status, o.error, o.body[:120]) for o in innocent.outcomes if not o.clean]
        report("sustained query of death", innocent.outcomes, bad_sent=len(bad.outcomes), innocent_failed=len(failed))
        assert len(innocent.outcomes) > 40 and not failed, failed[:5]
        assert [o.status for o in bad.outcomes] == [500] * SECONDS, [(o.status, o.body[:120]) for o in bad.outcomes]
        assert all(b'"error"' in o.body for o in bad.outcomes), "the replica's own error body reaches the client"
        assert all(r["breaker"] == "closed" and r["breaker_opened"] == 0 for r in gateway.replicas().values()), [
            (r["id"], r["breaker"], r["breaker_opened"]) for r in gateway.replicas().values()
        ]
        assert metric(gateway, "affinity_gateway_poison_requests_total") == SECONDS
        logged = gateway.proc.output()
        assert all(f"poison-{i}" in logged for i in range(SECONDS)) and "poison_request" in logged
        errors = httpx.get(f"{gateway.url}/metrics", timeout=5).text.splitlines()
        tried = sum(
            float(line.rsplit(" ", 1)[1])
            for line in errors
            if line.startswith("affinity_gateway_upstream_errors_total") and 'kind="http_500"' in line
        )
        assert tried == 2 * SECONDS, "a poison request is tried on two replicas, never a third"
