"""Per-key token buckets: requests per minute, and tokens charged before and after the answer; and
the fleet's shared quota on a real Redis: leases, owed tokens, and the local fallback."""

from __future__ import annotations

import uuid

import pytest

from gateway.config.features import ApiKeyConfig
from gateway.edge.auth import hash_key
from gateway.edge.rate_limits import RateLimits
from gateway.edge.shared_quota import SharedQuota
from gateway.errors import RateLimitError

pytestmark = pytest.mark.timeout(30)


async def test_request_bucket_bursts_to_its_rate_then_says_when_to_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("gateway.edge.rate_limits.time.monotonic", lambda: now[0])
    key, limits = ApiKeyConfig(hash_key("k"), "t", requests_per_minute=2), RateLimits()
    await limits.admit(key, 10)
    await limits.admit(key, 10)
    with pytest.raises(RateLimitError) as info:
        await limits.admit(key, 10)
    assert info.value.retry_after_s == pytest.approx(30.0)
    now[0] += 30
    await limits.admit(key, 10)


async def test_token_bucket_is_charged_for_prompt_then_completion(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr("gateway.edge.rate_limits.time.monotonic", lambda: now[0])
    key, limits = ApiKeyConfig(hash_key("k"), "t", tokens_per_minute=600), RateLimits()
    await limits.admit(key, 100)
    limits.charge_tokens(key, 600)  # a long answer overdraws the bucket
    with pytest.raises(RateLimitError) as info:
        await limits.admit(key, 1)
    assert info.value.retry_after_s == pytest.approx(10.1)
    now[0] = 10.1
    await limits.admit(key, 1)


async def test_unlimited_keys_have_no_buckets() -> None:
    key, limits = ApiKeyConfig(hash_key("k"), "t"), RateLimits()
    for _ in range(1000):
        await limits.admit(key, 10**6)


def pinned_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call in the same minute, 30 s into it (no test straddles a window)."""
    monkeypatch.setattr("gateway.edge.shared_quota.time.time", lambda: 1_800_000_030.0)
    monkeypatch.setattr("gateway.edge.rate_limits.time.time", lambda: 1_800_000_030.0)


async def test_two_gateways_share_one_request_quota(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pinned_window(monkeypatch)
    prefix = f"t{uuid.uuid4().hex}:"
    gateways = [RateLimits(SharedQuota(redis_url, prefix)) for _ in range(2)]
    key = ApiKeyConfig(hash_key("shared"), "t", requests_per_minute=10)
    admitted = 0
    for i in range(30):
        try:
            await gateways[i % 2].admit(key, 5)
            admitted += 1
        except RateLimitError as exc:
            assert exc.retry_after_s == pytest.approx(30.0) and "all gateways" in exc.message
    assert admitted == 10  # one quota, not two; leases of 1 (a twentieth of 10, rounded up)
    for g in gateways:
        assert g.shared is not None and not g.local_only
        await g.shared.close()


async def test_owed_tokens_reach_the_shared_counter(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pinned_window(monkeypatch)
    prefix = f"t{uuid.uuid4().hex}:"
    first, second = (RateLimits(SharedQuota(redis_url, prefix)) for _ in range(2))
    key = ApiKeyConfig(hash_key("tokens"), "t", tokens_per_minute=1000)
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
    key = ApiKeyConfig(hash_key("k"), "t", requests_per_minute=2)
    await limits.admit(key, 1)
    assert limits.local_only
    await limits.admit(key, 1)
    with pytest.raises(RateLimitError) as info:
        await limits.admit(key, 1)  # the local bucket, no Redis wait: it is not retried for RETRY_S
    assert "all gateways" not in info.value.message
    assert limits.shared is not None
    await limits.shared.close()
