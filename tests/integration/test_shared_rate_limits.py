"""Rate limits across gateways: two gateway processes sharing a real Redis enforce one
requests-per-minute quota for a key between them; with Redis unreachable each enforces its own and
`/ready` says so."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest

from gateway.edge.auth import hash_key
from tests.integration.gateway_procs import MODEL, pool, running, start_gateway, start_stub

pytestmark = pytest.mark.timeout(90)
KEY = "sk-fleet-0123456789"
AUTH = {"keys": [{"sha256": hash_key(KEY), "tenant": "acme", "requests_per_minute": 6}]}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def a_fresh_minute() -> None:
    """The quota is per wall-clock minute: start early in one, so the test never straddles two."""
    if (into := time.time() % 60) > 45:
        time.sleep(60 - into + 0.1)


def test_two_gateways_sharing_redis_enforce_one_quota(tmp_path: Path, redis_url: str) -> None:
    shared = {"redis": {"url": redis_url, "key_prefix": f"rl-{uuid.uuid4().hex}:"}, "index": {"store": "redis"}}
    with running() as track:
        stub = track(start_stub("s-0"))
        gateways = [track(start_gateway(tmp_path, {MODEL: pool(("s-0", stub.url))}, auth=AUTH, **shared))
                    for _ in range(2)]
        a_fresh_minute()
        statuses = [httpx.post(f"{gateways[i % 2].url}/v1/chat/completions", json=CHAT, timeout=10,
                               headers={"Authorization": f"Bearer {KEY}"}).status_code for i in range(12)]
        assert statuses.count(200) == 6 and statuses.count(429) == 6, statuses  # not 6 each
        for gw in gateways:
            assert "rate_limits" not in httpx.get(f"{gw.url}/ready", timeout=5).json()["degraded"]


def test_with_redis_unreachable_a_gateway_enforces_its_own_and_ready_says_so(tmp_path: Path) -> None:
    with running() as track:
        stub = track(start_stub("s-0"))
        gateway = track(start_gateway(tmp_path, {MODEL: pool(("s-0", stub.url))}, auth=AUTH,
                                      redis={"url": "redis://127.0.0.1:9/0"}, index={"store": "redis"}))
        statuses = [httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, timeout=10,
                               headers={"Authorization": f"Bearer {KEY}"}).status_code for _ in range(8)]
        assert statuses == [200] * 6 + [429] * 2  # its own bucket: the full quota, then no more
        ready = httpx.get(f"{gateway.url}/ready", timeout=5)
        assert ready.status_code == 200 and ready.json()["degraded"]["rate_limits"] == "local"
