"""Per-key token buckets: requests per minute, and tokens charged before and after the answer."""

from __future__ import annotations

import pytest

from gateway.auth import ApiKeyConfig, hash_key
from gateway.errors import RateLimitError
from gateway.ratelimit import RateLimits


def test_request_bucket_bursts_to_its_rate_then_says_when_to_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("gateway.ratelimit.time.monotonic", lambda: now[0])
    key, limits = ApiKeyConfig(hash_key("k"), "t", requests_per_minute=2), RateLimits()
    limits.admit(key, 10)
    limits.admit(key, 10)
    with pytest.raises(RateLimitError) as info:
        limits.admit(key, 10)
    assert info.value.retry_after_s == pytest.approx(30.0)
    now[0] += 30
    limits.admit(key, 10)


def test_token_bucket_is_charged_for_prompt_then_completion(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr("gateway.ratelimit.time.monotonic", lambda: now[0])
    key, limits = ApiKeyConfig(hash_key("k"), "t", tokens_per_minute=600), RateLimits()
    limits.admit(key, 100)
    limits.charge_tokens(key, 600)  # a long answer overdraws the bucket
    with pytest.raises(RateLimitError) as info:
        limits.admit(key, 1)
    assert info.value.retry_after_s == pytest.approx(10.1)
    now[0] = 10.1
    limits.admit(key, 1)


def test_unlimited_keys_have_no_buckets() -> None:
    key, limits = ApiKeyConfig(hash_key("k"), "t"), RateLimits()
    for _ in range(1000):
        limits.admit(key, 10**6)
