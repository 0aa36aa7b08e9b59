"""Per-API-key request and token rate limits: token buckets that refill continuously.

A bucket holds at most one minute's allowance and starts full, so a key may burst up to its
per-minute rate. Requests are charged one each at admission. Tokens are charged twice: the prompt
estimate at admission and the completion tokens the replica reported once the answer is done; a
key whose token bucket is empty (or below zero after a long answer) waits for it to refill.
Rates are read from the live config on every request, so a reload applies at once.

With a shared Redis (the top-level `redis:`) the quota is the fleet's, not each gateway's: see
`gateway.edge.shared_quota` (fixed minute windows there; these buckets again while Redis is down).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gateway.config.features import ApiKeyConfig
from gateway.edge.shared_quota import SharedQuota
from gateway.errors import RateLimitError
from gateway.request.exchange import FinishedRequest
from gateway.request.observers import RequestObserver


@dataclass(slots=True)
class _Bucket:
    level: float
    updated: float

    def refill(self, per_minute: float, now: float) -> None:
        self.level = min(per_minute, self.level + (now - self.updated) * per_minute / 60.0)
        self.updated = now

    def seconds_until(self, amount: float, per_minute: float) -> float:
        return max(0.0, (amount - self.level) * 60.0 / per_minute)


class RateLimits(RequestObserver):
    """Admits requests within their key's rates, and charges each answer's completion tokens."""

    def __init__(self, shared: SharedQuota | None = None) -> None:
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self.shared = shared

    @property
    def local_only(self) -> bool:
        """A shared quota is configured but Redis is unreachable: each gateway enforces its own."""
        return self.shared is not None and self.shared.degraded

    async def admit(self, key: ApiKeyConfig, prompt_tokens: int) -> None:
        """Charge one request and its prompt estimate, or raise 429 with the time until there is room.
        A shared quota costs a Redis round trip only when this gateway's lease is spent."""
        if self.shared is not None and await self._admit_shared(self.shared, key, prompt_tokens):
            return
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

    async def _admit_shared(self, shared: SharedQuota, key: ApiKeyConfig, prompt_tokens: int) -> bool:
        """True once charged to the fleet's quota; False when Redis is unreachable (local buckets decide)."""
        next_window_s = 60.0 - time.time() % 60.0
        for kind, per_minute, amount in (("requests", key.requests_per_minute, 1),
                                         ("tokens", key.tokens_per_minute, prompt_tokens)):
            if per_minute <= 0:
                continue
            admitted = await shared.admit(key.sha256, kind, per_minute, amount, whole=kind == "requests")
            if admitted is None:
                return False
            if not admitted:
                raise RateLimitError(f"rate limit of {per_minute:g} {kind} per minute reached (all gateways)",
                                     retry_after_s=next_window_s)
        return True

    def finished(self, done: FinishedRequest) -> None:
        if done.caller.key is not None and done.usage.completion_tokens:
            self.charge_tokens(done.caller.key, done.usage.completion_tokens)

    def charge_tokens(self, key: ApiKeyConfig, tokens: int) -> None:
        """The completion tokens of a finished answer."""
        if self.shared is not None and key.tokens_per_minute > 0 and not self.shared.degraded:
            self.shared.charge(key.sha256, "tokens", tokens)
            return
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
