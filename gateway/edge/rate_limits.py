"""Per-API-key request and token rate limits: no window of `auth.rate_limit_window_s` (a minute), aligned
or not, admits more than the key's rate (`gateway.edge.sliding_window`).

Requests are charged one each at admission. Tokens are charged twice: the prompt estimate at admission
and the completion tokens the replica reported once the answer is done; a key whose window holds its
whole token rate (or more, after a long answer) waits until enough of it has aged out. A refusal says
when that is (Retry-After). Rates are read from the live config on every request, so a reload applies
at once; the window's length is read at start.

With a shared Redis (the top-level `redis:`) the quota is the fleet's, not each gateway's: see
`gateway.edge.shared_quota`, which keeps the same windows in Redis; while Redis is unreachable these
local windows apply, by the same rule, each gateway the key's whole quota.
"""

from __future__ import annotations

import time

from gateway.config.features import ApiKeyConfig
from gateway.edge.shared_quota import SharedQuota
from gateway.edge.sliding_window import SlidingWindow
from gateway.errors import RateLimitError
from gateway.request.exchange import FinishedRequest
from gateway.request.observers import RequestObserver


class RateLimits(RequestObserver):
    """Admits requests within their key's rates, and charges each answer's completion tokens."""

    def __init__(self, shared: SharedQuota | None = None, window_s: float = 60.0) -> None:
        self._windows: dict[tuple[str, str], SlidingWindow] = {}
        self._window_s = window_s
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
        requests = self._window(key, "requests", key.requests_per_minute)
        tokens = self._window(key, "tokens", key.tokens_per_minute)
        if requests is not None and requests.used(now) + 1 > key.requests_per_minute:
            raise RateLimitError(
                f"rate limit of {key.requests_per_minute:g} requests per minute reached",
                retry_after_s=requests.retry_after(now, 1, key.requests_per_minute),
            )
        if tokens is not None and tokens.used(now) >= key.tokens_per_minute:
            raise RateLimitError(
                f"rate limit of {key.tokens_per_minute:g} tokens per minute reached",
                retry_after_s=tokens.retry_after(now, 1, key.tokens_per_minute),
            )
        if requests is not None:
            requests.add(now, 1)
        if tokens is not None:
            tokens.add(now, prompt_tokens)

    async def _admit_shared(self, shared: SharedQuota, key: ApiKeyConfig, prompt_tokens: int) -> bool:
        """True once charged to the fleet's quota; False when Redis is unreachable (local windows decide)."""
        for kind, per_minute, amount in (
            ("requests", key.requests_per_minute, 1),
            ("tokens", key.tokens_per_minute, prompt_tokens),
        ):
            if per_minute <= 0:
                continue
            wait_s = await shared.admit(key.sha256, kind, per_minute, amount, whole=kind == "requests")
            if wait_s is None:
                return False
            if wait_s:
                raise RateLimitError(
                    f"rate limit of {per_minute:g} {kind} per minute reached (all gateways)", retry_after_s=wait_s
                )
        return True

    def finished(self, done: FinishedRequest) -> None:
        if done.caller.key is not None and done.usage.completion_tokens:
            self.charge_tokens(done.caller.key, done.usage.completion_tokens)

    def charge_tokens(self, key: ApiKeyConfig, tokens: int) -> None:
        """The completion tokens of a finished answer."""
        if self.shared is not None and key.tokens_per_minute > 0 and not self.shared.degraded:
            self.shared.charge(key.sha256, "tokens", tokens)
            return
        window = self._window(key, "tokens", key.tokens_per_minute)
        if window is not None:
            window.add(time.monotonic(), tokens)

    def _window(self, key: ApiKeyConfig, kind: str, per_minute: float) -> SlidingWindow | None:
        if per_minute <= 0:
            return None
        window = self._windows.get((key.sha256, kind))
        if window is None:
            window = self._windows[(key.sha256, kind)] = SlidingWindow(self._window_s)
        return window
