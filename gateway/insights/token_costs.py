"""Token cost and cache savings per tenant and model, from the usage the replicas report.

Prices are per pool (YAML `pools.<model>.prices`), in money per million tokens:

    cost  = ((prompt − cached) × input + cached × cached_input + completion × output) / 1e6
    saved = cached × (input − cached_input) / 1e6      what the cache hits would have cost more

A finished request's usage (`gateway.request.usage`) adds to counters in memory, a few dict updates and no
I/O: lifetime totals per (tenant, model), exported as Prometheus counters at scrape time; one-minute
buckets per (tenant, model) for the last 24 hours (older ones are dropped: about 200 bytes per
active tenant and model per minute), behind `GET /admin/usage`; and, with a shared store, the deltas
not yet in Redis, which a background task adds there once a second (`gateway.insights.shared_usage`). The
model is the pool's name and the tenant a configured key's, so label sets stay bounded. A request
without a key counts under tenant "anonymous" (only possible with auth off, where no tenants exist).
A pool without prices still counts tokens; its cost and savings are null (not 0) in `/admin/usage`
and absent from the metrics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.errors import BadRequestError
from gateway.insights.shared_usage import SharedUsage
from gateway.request.exchange import FinishedRequest
from gateway.request.observers import RequestObserver
from gateway.request.usage import Usage

if TYPE_CHECKING:
    from gateway.config.loader import Config
    from gateway.config.pools import PoolConfig

log = structlog.get_logger("gateway.insights.token_costs")
ANONYMOUS = "anonymous"
BUCKET_S = 60
RETENTION_S = 24 * 3600
FLUSH_S = 1.0  # deltas go to Redis this often: other gateways' counts are at most this far behind
_RETENTION_MINUTES = RETENTION_S // BUCKET_S
_PER_MILLION = 1e6
Key = tuple[str, str]  # (tenant, model)


@dataclass(slots=True)
class Counts:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    priced_requests: int = 0  # those of `requests` whose pool had prices; none: cost and saved are unknown
    cost: float = 0.0
    saved: float = 0.0

    def add(self, other: Counts) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.cached_tokens += other.cached_tokens
        self.completion_tokens += other.completion_tokens
        self.priced_requests += other.priced_requests
        self.cost += other.cost
        self.saved += other.saved

    @classmethod
    def of(cls, fields: Mapping[str, float]) -> Counts:
        """From Redis fields (kinds another version may add are ignored)."""
        return cls(**{k: v for k, v in fields.items() if k in _KINDS})  # type: ignore[arg-type]

    def to_json(self) -> dict[str, Any]:
        priced = self.priced_requests > 0
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "priced_requests": self.priced_requests,
            "cost": round(self.cost, 9) if priced else None,
            "saved_by_cache": round(self.saved, 9) if priced else None,
        }


_KINDS = frozenset(f.name for f in dataclasses.fields(Counts))


@dataclass(frozen=True)
class UsageQuery:
    """`GET /admin/usage?tenant=&since=|window_s=`: whole minutes, from the one holding the start."""

    tenant: str | None
    start_s: float
    now_s: float

    @classmethod
    def parse(cls, query: Mapping[str, str], now_s: float) -> UsageQuery:
        since, window = query.get("since"), query.get("window_s")
        if since is not None and window is not None:
            raise BadRequestError("give since or window_s, not both", param="window_s")
        start = now_s - RETENTION_S
        if since is not None:
            start = _seconds(since, "since")
        elif window is not None:
            if (window_s := _seconds(window, "window_s")) <= 0:
                raise BadRequestError(f"window_s must be > 0, got {window_s:g}", param="window_s")
            start = now_s - window_s
        return cls(query.get("tenant") or None, max(start, now_s - RETENTION_S), now_s)

    @property
    def minutes(self) -> range:
        return range(int(self.start_s // BUCKET_S), int(self.now_s // BUCKET_S) + 1)


class TokenCosts(RequestObserver):
    """Tokens, cost and cache savings per tenant and model, from each finished request's usage."""

    def __init__(self, shared: SharedUsage | None = None) -> None:
        self.shared = shared
        self._totals: dict[Key, Counts] = {}  # since start: the Prometheus counters
        self._minutes: dict[int, dict[Key, Counts]] = {}  # minute -> this gateway's counts in it
        self._pending: dict[tuple[int, str, str], Counts] = {}  # not in Redis yet
        self._flushing = asyncio.Lock()
        self._stop = asyncio.Event()

    @classmethod
    def attach(cls, app: web.Application, config: Config, registry: CollectorRegistry) -> TokenCosts:
        """One per app: shared through the gateways' Redis if they share one (`redis`; a change needs a
        restart), exported on `registry`, its flush task running with the app."""
        redis = config.redis
        shared = SharedUsage(redis.resolved_url, redis.key_prefix, RETENTION_S + 3600) if redis is not None else None
        costs = cls(shared)
        registry.register(_CostCollector(costs))
        app.cleanup_ctx.append(costs._running)
        return costs

    def finished(self, done: FinishedRequest) -> None:
        self.record(done.caller.tenant, done.model, done.usage, done.pool)

    def record(self, tenant: str | None, model: str, usage: Usage, pool: PoolConfig | None) -> None:
        """One finished request (called once, from `gateway.serving.app._finished`); no usage: nothing to count."""
        if usage.prompt_tokens is None and usage.completion_tokens is None:
            return
        prompt = usage.prompt_tokens or 0
        cached = min(usage.cached_tokens or 0, prompt)
        completion = usage.completion_tokens or 0
        delta = Counts(1, prompt, cached, completion)
        prices = pool.prices if pool is not None else None
        if prices is not None:
            delta.priced_requests, delta.cost, delta.saved = (
                1,
                prices.cost(prompt, cached, completion),
                prices.saved(cached),
            )
        key = (tenant or ANONYMOUS, model)
        minute = int(time.time() // BUCKET_S)
        _into(self._totals, key, delta)
        _into(self._minutes.get(minute) or self._new_minute(minute), key, delta)
        if self.shared is not None:
            _into(self._pending, (minute, *key), delta)

    def totals(self) -> Iterator[tuple[Key, Counts]]:
        return iter(list(self._totals.items()))

    async def report(self, query: UsageQuery) -> dict[str, Any]:
        """The `/admin/usage` answer: the fleet's counts from Redis, or this gateway's own (no Redis
        configured, or Redis unreachable: then `degraded` says so)."""
        rows = None
        if self.shared is not None and await self.flush():
            found = await self.shared.read(query.minutes, query.tenant)
            rows = None if found is None else {key: Counts.of(fields) for key, fields in found.items()}
        source = "redis" if rows is not None else "local"
        if rows is None:
            rows = self._local(query.minutes, query.tenant)
        total = Counts()
        for counts in rows.values():
            total.add(counts)
        return {
            "source": source,
            "scope": "all gateways" if source == "redis" else "this gateway",
            "degraded": self.shared is not None and source == "local",
            "window": {
                "since": query.minutes.start * BUCKET_S,
                "until": round(query.now_s, 3),
                "bucket_s": BUCKET_S,
                "retention_s": RETENTION_S,
            },
            "tenant": query.tenant,
            "total": total.to_json(),
            "usage": [
                {"tenant": tenant, "model": model, **counts.to_json()}
                for (tenant, model), counts in sorted(rows.items())
            ],
        }

    async def flush(self) -> bool:
        """Add the pending deltas to Redis (True: none left); on failure keep them, a day's at most."""
        if self.shared is None:
            return False
        async with self._flushing:
            if not self._pending:
                return True
            batch, self._pending = self._pending, {}
            was_degraded = self.shared.degraded
            if await self.shared.add({key: dataclasses.asdict(counts) for key, counts in batch.items()}):
                if was_degraded:
                    log.info("usage_redis_back", flushed=len(batch))
                return True
            if not was_degraded:
                log.warning("usage_redis_unreachable", detail="usage counts kept in memory until Redis answers")
            oldest = int(time.time() // BUCKET_S) - _RETENTION_MINUTES
            for key, counts in batch.items():
                if key[0] > oldest:
                    _into(self._pending, key, counts)
            return False

    def _new_minute(self, minute: int) -> dict[Key, Counts]:
        for old in [m for m in self._minutes if m <= minute - _RETENTION_MINUTES]:
            del self._minutes[old]
        bucket = self._minutes[minute] = {}
        return bucket

    def _local(self, minutes: range, tenant: str | None) -> dict[Key, Counts]:
        rows: dict[Key, Counts] = {}
        for minute in minutes:
            for key, counts in self._minutes.get(minute, {}).items():
                if tenant is None or key[0] == tenant:
                    _into(rows, key, counts)
        return rows

    async def _running(self, app: web.Application) -> AsyncIterator[None]:
        """With Redis: flush once a second while the app runs, once more at its end, then close."""
        if self.shared is None:
            yield
            return
        task = asyncio.get_running_loop().create_task(self._flush_loop(), name="usage-flush")
        yield
        self._stop.set()
        await task
        if not self.shared.degraded:  # what finished during the loop's last flush (a down Redis: lost)
            await self.flush()
        await self.shared.close()

    async def _flush_loop(self) -> None:
        while not self._stop.is_set():
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), FLUSH_S)
            await self.flush()


def _into(table: dict[Any, Counts], key: Any, delta: Counts) -> None:
    counts = table.get(key)
    if counts is None:
        counts = table[key] = Counts()
    counts.add(delta)


def _seconds(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise BadRequestError(f"{name} must be a number of seconds, got {text!r}", param=name)
    return value


class _CostCollector(Collector):
    """This gateway's counters since it started (Prometheus sums the gateways)."""

    def __init__(self, costs: TokenCosts) -> None:
        self._costs = costs

    def collect(self) -> Iterator[Metric]:
        tokens = CounterMetricFamily(
            "affinity_gateway_tokens",
            "Tokens the replicas reported, by tenant, model "
            "(pool) and kind: prompt (cached included), cached, completion",
            labels=["tenant", "model_name", "kind"],
        )
        cost = CounterMetricFamily(
            "affinity_gateway_cost",
            "Money spent at the pool's prices (pools.<model>.prices), by tenant and model",
            labels=["tenant", "model_name"],
        )
        saved = CounterMetricFamily(
            "affinity_gateway_cache_savings",
            "Money the prefix cache saved: cached tokens x (input - cached_input price)",
            labels=["tenant", "model_name"],
        )
        for (tenant, model), counts in self._costs.totals():
            for kind, value in (
                ("prompt", counts.prompt_tokens),
                ("cached", counts.cached_tokens),
                ("completion", counts.completion_tokens),
            ):
                tokens.add_metric([tenant, model, kind], value)
            if counts.priced_requests:
                cost.add_metric([tenant, model], counts.cost)
                saved.add_metric([tenant, model], counts.saved)
        yield tokens
        yield cost
        yield saved
