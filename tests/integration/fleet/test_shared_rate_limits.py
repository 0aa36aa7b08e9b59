"""Rate limits across gateways: two gateway processes sharing a real Redis enforce one
requests-per-minute quota for a key between them, over a sliding window (no window, aligned or not,
admits more than the rate); with Redis unreachable each enforces its own, by the same rule, and
`/ready` says so. The window tests shorten the window to WINDOW_S (`auth.rate_limit_window_s`, a test
knob) so that two windows pass in seconds, not minutes."""

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


WINDOW_S = 6.0


def alternating(urls: list[str], n: int, every_s: float) -> list[tuple[float, float, int]]:
    """(sent, answered, status) of `n` requests, one every `every_s`, alternating over `urls`."""
    out = []
    start = time.monotonic()
    with httpx.Client(timeout=10, headers={"Authorization": f"Bearer {KEY}"}) as http:
        for i in range(n):
            time.sleep(max(0.0, start + i * every_s - time.monotonic()))
            sent = time.monotonic()
            status = http.post(f"{urls[i % len(urls)]}/v1/chat/completions", json=CHAT).status_code
            out.append((sent, time.monotonic(), status))
    return out


def no_window_admits_more_than(outcomes: list[tuple[float, float, int]], limit: int) -> bool:
    """The (limit+1)-th admission after any admission came a whole window later: its answer at least
    WINDOW_S after the first's request was sent (the admissions themselves lie in between)."""
    admitted = [(sent, answered) for sent, answered, status in outcomes if status == 200]
    return all(admitted[i + limit][1] - admitted[i][0] >= WINDOW_S for i in range(len(admitted) - limit))


def test_two_gateways_sharing_redis_enforce_one_quota(tmp_path: Path, redis_url: str) -> None:
    shared = {"redis": {"url": redis_url, "key_prefix": f"rl-{uuid.uuid4().hex}:"}, "index": {"store": "redis"}}
    with running() as track:
        stub = track(start_stub("s-0"))
        gateways = [
            track(start_gateway(tmp_path, {MODEL: pool(("s-0", stub.url))}, auth=AUTH, **shared)) for _ in range(2)
        ]
        statuses = [
            httpx.post(
                f"{gateways[i % 2].url}/v1/chat/completions",
                json=CHAT,
                timeout=10,
                headers={"Authorization": f"Bearer {KEY}"},
            ).status_code
            for i in range(12)
        ]
        assert statuses.count(200) == 6 and statuses.count(429) == 6, statuses  # not 6 each
        for gw in gateways:
            assert "rate_limits" not in httpx.get(f"{gw.url}/ready", timeout=5).json()["degraded"]


def test_with_redis_unreachable_a_gateway_enforces_its_own_and_ready_says_so(tmp_path: Path) -> None:
    with running() as track:
        stub = track(start_stub("s-0"))
        gateway = track(
            start_gateway(
                tmp_path,
                {MODEL: pool(("s-0", stub.url))},
                auth=AUTH,
                redis={"url": "redis://127.0.0.1:9/0"},
                index={"store": "redis"},
            )
        )
        statuses = [
            httpx.post(
                f"{gateway.url}/v1/chat/completions", json=CHAT, timeout=10, headers={"Authorization": f"Bearer {KEY}"}
            ).status_code
            for _ in range(8)
        ]
        assert statuses == [200] * 6 + [429] * 2  # its own bucket: the full quota, then no more
        ready = httpx.get(f"{gateway.url}/ready", timeout=5)
        assert ready.status_code == 200 and ready.json()["degraded"]["rate_limits"] == "local"


def window_auth(limit: int) -> dict[str, object]:
    return {**AUTH, "keys": [{**AUTH["keys"][0], "requests_per_minute": limit}], "rate_limit_window_s": WINDOW_S}


def test_two_gateways_admit_no_more_than_the_rate_in_any_window(tmp_path: Path, redis_url: str) -> None:
    # Issue 36: the quota per fixed wall-clock minute let 20 of 24 through within 6.5 s across a minute's edge.
    shared = {"redis": {"url": redis_url, "key_prefix": f"rl-{uuid.uuid4().hex}:"}}
    with running() as track:
        stub = track(start_stub("s-0"))
        gateways = [
            track(start_gateway(tmp_path, {MODEL: pool(("s-0", stub.url))}, auth=window_auth(10), **shared))
            for _ in range(2)
        ]
        outcomes = alternating([gw.url for gw in gateways], 24, WINDOW_S / 12)  # two windows
        statuses = [status for _, _, status in outcomes]
        assert no_window_admits_more_than(outcomes, 10), statuses
        assert statuses[:10] == [200] * 10 and statuses.count(200) >= 16, statuses  # and the rate, not less


def test_with_redis_unreachable_the_local_window_follows_the_same_rule(tmp_path: Path) -> None:
    with running() as track:
        stub = track(start_stub("s-0"))
        gateway = track(
            start_gateway(
                tmp_path, {MODEL: pool(("s-0", stub.url))}, auth=window_auth(10), redis={"url": "redis://127.0.0.1:9/0"}
            )
        )
        outcomes = alternating([gateway.url], 24, WINDOW_S / 12)
        statuses = [status for _, _, status in outcomes]
        assert no_window_admits_more_than(outcomes, 10), statuses
        assert statuses[:10] == [200] * 10 and statuses.count(200) >= 16, statuses
        assert httpx.get(f"{gateway.url}/ready", timeout=5).json()["degraded"]["rate_limits"] == "local"
