"""Per-key token buckets: requests per minute, and tokens charged before and after the answer; and
the fleet's shared quota on a real Redis: leases, owed tokens, and the local fallback."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from gateway.config.features import ApiKeyConfig
from gateway.edge.auth import hash_key
from gateway.edge.rate_limits import RateLimits
from gateway.edge.shared_quota import SharedQuota
from gateway.errors import RateLimitError

pytestmark = pytest.mark.timeout(30)


def at_most_per_window(times: list[float], limit: int, window_s: float = 60.0) -> bool:
    """No window of `window_s`, aligned or not, holds more than `limit` of these admission times."""
    times = sorted(times)
    return all(times[i + limit] - times[i] >= window_s for i in range(len(times) - limit))


async def test_requests_within_any_window_then_says_when_to_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("gateway.edge.rate_limits.time.monotonic", lambda: now[0])
    key, limits = ApiKeyConfig(sha256=hash_key("k"), tenant="t", requests_per_minute=2), RateLimits()
    await limits.admit(key, 10)
    await limits.admit(key, 10)
    with pytest.raises(RateLimitError) as info:
        await limits.admit(key, 10)
    assert info.value.retry_after_s == pytest.approx(62.0)  # the window, counted in whole buckets, and one more
    now[0] += 61.9
    with pytest.raises(RateLimitError):
        await limits.admit(key, 10)
    now[0] += 0.1
    await limits.admit(key, 10)


async def test_tokens_are_charged_for_prompt_then_completion(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr("gateway.edge.rate_limits.time.monotonic", lambda: now[0])
    key, limits = ApiKeyConfig(sha256=hash_key("k"), tenant="t", tokens_per_minute=600), RateLimits()
    await limits.admit(key, 100)
    now[0] = 5.0
    limits.charge_tokens(key, 600)  # a long answer overdraws the window
    with pytest.raises(RateLimitError) as info:
        await limits.admit(key, 1)
    assert info.value.retry_after_s == pytest.approx(62.0)  # from 5 s: the prompt's bucket ageing out is not enough
    now[0] = 66.9
    with pytest.raises(RateLimitError):
        await limits.admit(key, 1)
    now[0] = 67.0
    await limits.admit(key, 1)


@pytest.mark.parametrize("step_s", [0.25, 5.0])
async def test_no_window_admits_more_than_the_rate_locally(monkeypatch: pytest.MonkeyPatch, step_s: float) -> None:
    # A token bucket admitted its full rate and then a refill on top within the same minute.
    now = [1_800_000_055.0]
    monkeypatch.setattr("gateway.edge.rate_limits.time.monotonic", lambda: now[0])
    key, limits, admitted = ApiKeyConfig(sha256=hash_key("k"), tenant="t", requests_per_minute=10), RateLimits(), []
    for _ in range(48):
        try:
            await limits.admit(key, 1)
            admitted.append(now[0])
        except RateLimitError:
            pass
        now[0] += step_s
    assert at_most_per_window(admitted, 10) and len(admitted) >= 10


async def test_unlimited_keys_have_no_buckets() -> None:
    key, limits = ApiKeyConfig(sha256=hash_key("k"), tenant="t"), RateLimits()
    for _ in range(1000):
        await limits.admit(key, 10**6)


def pinned_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call at one instant, 30 s into a minute."""
    monkeypatch.setattr("gateway.edge.shared_quota.time.time", lambda: 1_800_000_030.0)
    monkeypatch.setattr("gateway.edge.rate_limits.time.time", lambda: 1_800_000_030.0)


async def test_two_gateways_share_one_request_quota(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pinned_window(monkeypatch)
    prefix = f"t{uuid.uuid4().hex}:"
    gateways = [RateLimits(SharedQuota(redis_url, prefix)) for _ in range(2)]
    key = ApiKeyConfig(sha256=hash_key("shared"), tenant="t", requests_per_minute=10)
    admitted = 0
    for i in range(30):
        try:
            await gateways[i % 2].admit(key, 5)
            admitted += 1
        except RateLimitError as exc:
            assert exc.retry_after_s == pytest.approx(62.0) and "all gateways" in exc.message
    assert admitted == 10  # one quota, not two; leases of 1 (a twentieth of 10, rounded up)
    for g in gateways:
        assert g.shared is not None and not g.local_only
        await g.shared.close()


async def test_owed_tokens_reach_the_shared_counter(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pinned_window(monkeypatch)
    prefix = f"t{uuid.uuid4().hex}:"
    first, second = (RateLimits(SharedQuota(redis_url, prefix)) for _ in range(2))
    key = ApiKeyConfig(sha256=hash_key("tokens"), tenant="t", tokens_per_minute=1000)
    await first.admit(key, 200)  # any room admits; the prompt beyond the lease is owed
    first.charge_tokens(key, 900)  # a long answer: the key is past its quota now
    assert first.shared is not None
    for task in list(first.shared._owed):
        await task
    with pytest.raises(RateLimitError):
        await second.admit(key, 1)  # the other gateway sees it
    for g in (first, second):
        assert g.shared is not None
        await g.shared.close()


async def test_with_redis_down_each_gateway_enforces_locally_and_says_so() -> None:
    limits = RateLimits(SharedQuota("redis://127.0.0.1:9/0", "down:"))
    key = ApiKeyConfig(sha256=hash_key("k"), tenant="t", requests_per_minute=2)
    await limits.admit(key, 1)
    assert limits.local_only
    await limits.admit(key, 1)
    with pytest.raises(RateLimitError) as info:
        await limits.admit(key, 1)  # the local bucket, no Redis wait: it is not retried for RETRY_S
    assert "all gateways" not in info.value.message
    assert limits.shared is not None
    await limits.shared.close()


@pytest.mark.parametrize("step_s", [0.25, 5.0])
async def test_two_gateways_admit_no_more_than_the_rate_in_any_window_across_a_minute_boundary(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, step_s: float
) -> None:
    # Issue 36: per wall-clock minute, 20 of 24 were admitted within 6.5 s across a minute's edge.
    now = [1_800_000_055.0]  # 5 s before a minute boundary; the fake clock is both gateways' wall and monotonic
    for name in (
        "gateway.edge.shared_quota.time.time",
        "gateway.edge.shared_quota.time.monotonic",
        "gateway.edge.rate_limits.time.monotonic",
        "gateway.edge.rate_limits.time.time",
    ):
        monkeypatch.setattr(name, lambda: now[0], raising=False)
    prefix = f"t{uuid.uuid4().hex}:"
    gateways = [RateLimits(SharedQuota(redis_url, prefix)) for _ in range(2)]
    key, admitted = ApiKeyConfig(sha256=hash_key("window"), tenant="t", requests_per_minute=10), []
    for i in range(24 if step_s < 1 else 48):
        try:
            await gateways[i % 2].admit(key, 1)
            admitted.append(now[0])
        except RateLimitError:
            pass
        now[0] += step_s
    assert at_most_per_window(admitted, 10), f"{len(admitted)} admitted within {admitted[-1] - admitted[0]:.2f} s"
    assert len(admitted) == 10 if step_s < 1 else len(admitted) >= 20  # over 4 minutes: the rate, not less
    for g in gateways:
        assert g.shared is not None and not g.local_only
        await g.shared.close()


async def test_a_lease_lives_one_bucket_and_gives_back_what_it_left(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1_800_000_030.0]
    for name in ("time.time", "time.monotonic"):
        monkeypatch.setattr(f"gateway.edge.shared_quota.{name}", lambda: now[0])
    prefix = f"t{uuid.uuid4().hex}:"
    quota = SharedQuota(redis_url, prefix)
    assert await quota.admit("d", "requests", 100, 1, whole=True) == 0.0  # a lease of 5, 1 spent
    now[0] += 1.5  # past the lease's bucket: the 4 left are void and given back
    assert await quota.admit("d", "requests", 100, 1, whole=True) == 0.0
    for task in list(quota._owed):
        await task
    client = aioredis.from_url(redis_url)
    counted = await client.hgetall(f"{prefix}ratelimit:d:requests")
    await client.aclose()
    assert sum(int(v) for v in counted.values()) == 1 + 5  # the first lease's one, the second lease whole
    await quota.close()
