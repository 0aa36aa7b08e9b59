"""Per-API-key request and token rate limits: token buckets that refill continuously.

A bucket holds at most one minute's allowance and starts full, so a key may burst up to its
per-minute rate. Requests are charged one each at admission. Tokens are charged twice: the prompt
estimate at admission and the completion tokens the replica reported once the answer is done; a
key whose token bucket is empty (or below zero after a long answer) waits for it to refill.
Rates are read from the live config on every request, so a reload applies at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gateway.auth import ApiKeyConfig
from gateway.errors import RateLimitError


@dataclass(slots=True)
class _Bucket:
    level: float
    updated: float

    def refill(self, per_minute: float, now: float) -> None:
        self.level = min(per_minute, self.level + (now - self.updated) * per_minute / 60.0)
        self.updated = now

    def seconds_until(self, amount: float, per_minute: float) -> float:
        return max(0.0, (amount - self.level) * 60.0 / per_minute)


class RateLimits:
    def __init__(self) -> None:
        self._buckets: dict[tuple[str, str], _Bucket] = {}

    def admit(self, key: ApiKeyConfig, prompt_tokens: int) -> None:
        """Charge one request and its prompt estimate, or raise 429 with the time until there is room."""
        now = time.monotonic()
        requests = self._bucket(key, "requests", key.requests_per_minute, now)
        tokens = self._bucket(key, "tokens", key.tokens_per_minute, now)
        if requests is not None and requests.level < 1:
            raise RateLimitError(f"rate limit of {key.requests_per_minute:g} requests per minute reached",
                                 retry_after_s=requests.seconds_until(1, key.requests_per_minute))
        if tokens is not None and tokens.level <= 0:
            raise RateLimitError(f"rate limit of {key.tokens_per_minute:g} tokens per minute reached",
                                 retry_after_s=tokens.seconds_until(1, key.tokens_per_minute))
        if requests is not None:
            requests.level -= 1
        if tokens is not None:
            tokens.level -= prompt_tokens

    def charge_tokens(self, key: ApiKeyConfig, tokens: int) -> None:
        """The completion tokens of a finished answer."""
        bucket = self._bucket(key, "tokens", key.tokens_per_minute, time.monotonic())
        if bucket is not None:
            bucket.level -= tokens

    def _bucket(self, key: ApiKeyConfig, kind: str, per_minute: float, now: float) -> _Bucket | None:
        if per_minute <= 0:
            return None
        bucket = self._buckets.get((key.sha256, kind))
        if bucket is None:
            bucket = self._buckets[(key.sha256, kind)] = _Bucket(per_minute, now)
        bucket.refill(per_minute, now)
        return bucket
