"""One replica: its address, its exact in-flight count, its health and the load it reports.

Health has two inputs. Active probes flip `healthy` after `unhealthy_after` consecutive failures or
`healthy_after` consecutive passes. Passive failures (connect errors, 5xx, timeouts seen by real
requests; never client cancels or 4xx) eject the replica after `eject_after_failures` in a row, for a
backoff that doubles with each ejection; it comes back once the backoff is over and a probe passes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gateway.config import HealthConfig, ReplicaConfig


@dataclass(slots=True)
class ReplicaLoad:
    """What the replica's own /metrics said at the last scrape (zeros when unknown)."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    num_gpu_blocks: int | None = None  # from vllm:cache_config_info, for the warm-prefix index capacity
    block_size: int | None = None
    scraped_at: float = 0.0  # time.monotonic() of the last good scrape, 0 = never


@dataclass(slots=True)
class Replica:
    replica_id: str
    url: str
    weight: float = 1.0
    in_flight: int = 0
    healthy: bool = True  # optimistic until the first probe says otherwise
    load: ReplicaLoad = field(default_factory=ReplicaLoad)
    probe_passes: int = 0
    probe_failures: int = 0
    passive_failures: int = 0
    ejections: int = 0  # consecutive ejections, sets the backoff
    ejected_until: float = 0.0
    last_error: str = ""

    @classmethod
    def from_config(cls, config: ReplicaConfig) -> "Replica":
        return cls(config.replica_id, config.url.rstrip("/"), config.weight)

    def is_available(self, now: float | None = None) -> bool:
        return self.healthy and (now if now is not None else time.monotonic()) >= self.ejected_until

    def probe_result(self, ok: bool, health: HealthConfig, error: str = "") -> None:
        if ok:
            self.probe_passes, self.probe_failures = self.probe_passes + 1, 0
            backoff_over = time.monotonic() >= self.ejected_until
            if not self.healthy and self.probe_passes >= health.healthy_after and backoff_over:
                self.healthy = True
        else:
            self.probe_passes, self.probe_failures = 0, self.probe_failures + 1
            self.last_error = error
            if self.probe_failures >= health.unhealthy_after:
                self.healthy = False

    def request_failed(self, health: HealthConfig, error: str) -> bool:
        """Count an upstream fault; returns True when this one ejected the replica."""
        self.passive_failures += 1
        self.last_error = error
        if self.passive_failures < health.eject_after_failures:
            return False
        backoff = min(health.backoff_max_s, health.backoff_s * 2 ** self.ejections)
        self.ejections += 1
        self.passive_failures = 0
        self.healthy, self.probe_passes = False, 0
        self.ejected_until = time.monotonic() + backoff
        return True

    def request_succeeded(self) -> None:
        self.passive_failures = 0
        self.ejections = 0

    def describe(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "id": self.replica_id, "url": self.url, "weight": self.weight,
            "available": self.is_available(now), "healthy": self.healthy,
            "ejected_for_s": round(max(0.0, self.ejected_until - now), 3),
            "in_flight": self.in_flight, "running": self.load.running, "waiting": self.load.waiting,
            "kv_usage": self.load.kv_usage, "num_gpu_blocks": self.load.num_gpu_blocks,
            "block_size": self.load.block_size,
            "load_age_s": round(now - self.load.scraped_at, 3) if self.load.scraped_at else None,
            "passive_failures": self.passive_failures, "last_error": self.last_error,
        }
