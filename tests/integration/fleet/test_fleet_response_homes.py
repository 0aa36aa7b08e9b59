"""Stored responses across a fleet (issue 36): two gateway processes share a real redis-server, three
replica stubs behind round robin. A response created through gateway A is continued through gateway B
with `previous_response_id`: B finds the home in Redis and the follow-up reaches the replica that stored
it (round robin alone would send two of three elsewhere, where vLLM answers 404). With Redis stopped,
B asks the replicas in turn instead, and `/ready` says so."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.integration.gateway_procs import MODEL, Gateway, pool, running, start_gateway, start_stub
from tests.integration.reliability_tools import RedisServer, eventually, metric

pytestmark = pytest.mark.timeout(120)
FOLLOW_UPS = 10
TTL_S = 600


def create(gw: Gateway, text: str, previous: str | None = None) -> httpx.Response:
    body = {
        "model": MODEL,
        "input": text,
        "max_output_tokens": 4,
        **({"previous_response_id": previous} if previous else {}),
    }
    return httpx.post(f"{gw.url}/v1/responses", json=body, timeout=20)


def homes_found(gw: Gateway, source: str) -> float:
    return metric(gw, f'affinity_gateway_response_home_lookups_total{{source="{source}"}}') or 0.0


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Gateway, Gateway, RedisServer, str]]:
    server = RedisServer().start()
    prefix = f"homes-{uuid.uuid4().hex}:"
    try:
        with running() as track:
            stubs = [track(start_stub(f"home-{i}")) for i in range(3)]
            pools = {MODEL: pool(*((s.replica_id, s.url) for s in stubs), policy="round_robin")}
            shared = {"redis": {"url": server.url, "key_prefix": prefix, "response_ttl_s": TTL_S}}
            yield (
                track(start_gateway(tmp_path, pools, **shared)),
                track(start_gateway(tmp_path, pools, **shared)),
                server,
                prefix,
            )
    finally:
        server.stop()


def test_follow_ups_through_another_gateway_reach_the_home_via_redis(
    fleet: tuple[Gateway, Gateway, RedisServer, str],
) -> None:
    a, b, server, prefix = fleet
    made = [create(a, f"Tell me about letter {i} of 1907.") for i in range(FOLLOW_UPS)]
    assert all(r.status_code == 200 for r in made), [r.text for r in made]
    client = redis.Redis(port=server.port)
    for r in made:  # written off the request path, with the configured TTL
        eventually(lambda r=r: client.exists(f"{prefix}response:{r.json()['id']}") == 1, timeout_s=5)
        assert 0 < client.ttl(f"{prefix}response:{r.json()['id']}") <= TTL_S
    client.close()
    assert create(b, "Out of step.").status_code == 200  # B's round robin one ahead of A's: it alone never lands home
    reached = 0
    for r in made:
        follow = create(b, "And then?", previous=r.json()["id"])
        reached += follow.status_code == 200 and follow.headers["X-Replica-Id"] == r.headers["X-Replica-Id"]
    assert reached == FOLLOW_UPS, f"{reached} of {FOLLOW_UPS}"
    assert homes_found(b, "redis") == FOLLOW_UPS and homes_found(b, "replicas") == 0
    for gw in (a, b):
        assert "response_homes" not in httpx.get(f"{gw.url}/ready", timeout=5).json()["degraded"]


def test_with_redis_stopped_follow_ups_ask_the_replicas_in_turn(
    fleet: tuple[Gateway, Gateway, RedisServer, str],
) -> None:
    a, b, server, _ = fleet
    server.stop()
    made = [create(a, f"Name colour {i}.") for i in range(FOLLOW_UPS)]
    assert all(r.status_code == 200 for r in made), [r.text for r in made]
    assert create(b, "Out of step.").status_code == 200  # B's round robin one ahead of A's: it alone never lands home
    reached = 0
    for r in made:
        follow = create(b, "Another?", previous=r.json()["id"])
        reached += follow.status_code == 200 and follow.headers["X-Replica-Id"] == r.headers["X-Replica-Id"]
    assert reached == FOLLOW_UPS, f"{reached} of {FOLLOW_UPS}"
    assert homes_found(b, "replicas") == FOLLOW_UPS
    for gw in (a, b):
        ready = httpx.get(f"{gw.url}/ready", timeout=5)
        assert ready.status_code == 200 and ready.json()["degraded"]["response_homes"] == "ask_replicas"
