"""A pool never ejects itself, through a real gateway process over in-test replicas on loopback.

- Every replica answers 503 for a moment (an overload blip, no retries so each is charged): the breakers
  open on at most `health.max_ejection_percent` of the pool, so when the blip ends the rest serve at once.
- Every replica fails its health probe while still answering requests: with none available the pool routes
  to all of them (panic) instead of answering 503 to everyone.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.integration.gateway_procs import MODEL, pool, running, start_gateway
from tests.integration.reliability_tools import chat, eventually, report
from tests.upstream import FakeReplica, ThreadServer

pytestmark = pytest.mark.timeout(60)


def _serve(fakes: list[FakeReplica]) -> tuple[list[ThreadServer], list[str]]:
    servers = [ThreadServer(fake.app) for fake in fakes]
    return servers, [server.__enter__() for server in servers]


def test_a_blip_on_every_replica_ejects_at_most_the_share(tmp_path: Path) -> None:
    fakes = [FakeReplica(f"r{i}", status=503) for i in range(3)]
    servers, urls = _serve(fakes)
    try:
        with running() as track:
            gateway = track(
                start_gateway(
                    tmp_path,
                    {MODEL: pool(*((f.replica_id, u) for f, u in zip(fakes, urls)))},
                    health={
                        "interval_s": 0.2,
                        "timeout_s": 1.0,
                        "eject_after_failures": 2,
                        "failure_window_s": 30.0,
                        "backoff_s": 30.0,
                        "backoff_max_s": 60.0,
                        "max_ejection_percent": 34,
                    },
                    limits={"max_retries": 0},
                )
            )
            with httpx.Client(base_url=gateway.url, timeout=10) as http:
                blip = [http.post("/v1/chat/completions", json=chat(f"blip {i}")).status_code for i in range(12)]
                for fake in fakes:
                    fake.status = 200
                after = [http.post("/v1/chat/completions", json=chat(f"after {i}")) for i in range(10)]
            replicas = gateway.replicas().values()
            opened = [r["id"] for r in replicas if r["breaker"] != "closed"]
            report(
                "503 blip on every replica",
                [],
                blip=sorted(set(blip)),
                ejected=len(opened),
                after_ok=sum(a.status_code == 200 for a in after),
            )
            assert set(blip) == {503}
            assert len(opened) == 1, [(r["id"], r["breaker"]) for r in replicas]  # 34 % of 3: one replica
            assert [a.status_code for a in after] == [200] * 10, [a.text[:120] for a in after]
            assert {a.headers["X-Replica-Id"] for a in after} == {"r0", "r1", "r2"} - set(opened)
            assert "breaker_held" in gateway.proc.output()
    finally:
        for server in servers:
            server.__exit__()


def test_every_replica_failing_its_probe_routes_to_all_of_them(tmp_path: Path) -> None:
    fakes = [FakeReplica(f"r{i}", healthy=False) for i in range(2)]
    servers, urls = _serve(fakes)
    try:
        with running() as track:
            gateway = track(
                start_gateway(
                    tmp_path,
                    {MODEL: pool(*((f.replica_id, u) for f, u in zip(fakes, urls)))},
                    health={"interval_s": 0.1, "timeout_s": 0.5, "unhealthy_after": 1},
                )
            )
            eventually(lambda: not any(r["available"] for r in gateway.replicas().values()))
            with httpx.Client(base_url=gateway.url, timeout=10) as http:
                answers = [http.post("/v1/chat/completions", json=chat(f"panic {i}")) for i in range(6)]
                ready = http.get("/ready").status_code
            report("every replica failing its probe", [], ok=sum(a.status_code == 200 for a in answers), ready=ready)
            assert [a.status_code for a in answers] == [200] * 6, [a.text[:120] for a in answers]
            assert {a.headers["X-Replica-Id"] for a in answers} == {"r0", "r1"}
            assert ready == 503, "readiness still says no replica is healthy"
            assert "pool_panic" in gateway.proc.output()
    finally:
        for server in servers:
            server.__exit__()
