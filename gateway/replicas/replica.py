"""One replica: its address, its exact in-flight count, its health and the load it reports.

Health has two inputs. Active probes flip `healthy` after `unhealthy_after` consecutive failures or
`healthy_after` consecutive passes. Upstream faults seen by real requests (connect errors, 5xx,
timeouts; never client cancels or 4xx) feed the replica's circuit breaker (`breaker.py`), which takes
it out of rotation and lets one trial request test it after a backoff. It takes traffic when both agree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gateway.config.pools import ReplicaConfig
from gateway.config.sections import HealthConfig
from gateway.replicas.breaker import CircuitBreaker


@dataclass(slots=True)
class ReplicaLoad:
    """What the replica's own /metrics said at the last scrape (zeros when unknown)."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    num_gpu_blocks: int | None = None  # from vllm:cache_config_info, for the warm-prefix index capacity
    block_size: int | None = None
    completed: float | None = None  # vllm:request_success_total: falls only when the engine restarted
    scraped_at: float = 0.0  # time.monotonic() of the last good scrape, 0 = never


@dataclass(slots=True)
class Replica:
    replica_id: str
    url: str
    weight: float = 1.0
    in_flight: int = 0
    healthy: bool = True  # optimistic until the first probe says otherwise
    ready: bool = True  # Kubernetes readiness (gateway.replicas.discovery.kubernetes): an unready pod takes no traffic
    load: ReplicaLoad = field(default_factory=ReplicaLoad)
    probe_passes: int = 0
    probe_failures: int = 0
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    last_error: str = ""
    adapters: dict[str, str | None] = field(default_factory=dict)  # LoRA name -> path, from its /v1/models
    model_card: dict[str, Any] = field(default_factory=dict)  # its own entry there: max_model_len, root
    declared_adapters: tuple[str, ...] = ()  # from its config or its Kubernetes labels
    role: str = "both"  # prefill | decode | both: recorded for later disaggregated splits, not routed on

    @classmethod
    def from_config(cls, config: ReplicaConfig) -> Replica:
        return cls(
            config.replica_id,
            config.url.rstrip("/"),
            config.weight,
            declared_adapters=config.adapters,
            role=config.role,
        )

    def is_available(self, now: float | None = None) -> bool:
        return self.ready and self.healthy and self.breaker.allows(now if now is not None else time.monotonic())

    def probe_result(self, ok: bool, health: HealthConfig, error: str = "") -> None:
        if ok:
            self.probe_passes, self.probe_failures = self.probe_passes + 1, 0
            if not self.healthy and self.probe_passes >= health.healthy_after:
                self.healthy = True
        else:
            self.probe_passes, self.probe_failures = 0, self.probe_failures + 1
            self.last_error = error
            if self.probe_failures >= health.unhealthy_after:
                self.healthy = False

    def request_failed(self, health: HealthConfig, error: str, may_open: bool = True) -> bool:
        """Count an upstream fault; returns True when this one opened the breaker (`may_open`: the pool's
        ejection cap, `ReplicaPool.fault`)."""
        self.last_error = error
        return self.breaker.fault(
            time.monotonic(),
            health.eject_after_failures,
            health.failure_window_s,
            health.backoff_s,
            health.backoff_max_s,
            may_open,
        )

    def request_succeeded(self) -> None:
        self.breaker.success(time.monotonic())

    def describe(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "id": self.replica_id,
            "url": self.url,
            "weight": self.weight,
            "available": self.is_available(now),
            "healthy": self.healthy,
            "ready": self.ready,
            "breaker": self.breaker.state(now),
            "ejected_for_s": round(max(0.0, self.breaker.open_until - now), 3),
            "in_flight": self.in_flight,
            "running": self.load.running,
            "waiting": self.load.waiting,
            "kv_usage": self.load.kv_usage,
            "num_gpu_blocks": self.load.num_gpu_blocks,
            "block_size": self.load.block_size,
            "completed": self.load.completed,
            "load_age_s": round(now - self.load.scraped_at, 3) if self.load.scraped_at else None,
            "recent_faults": len(self.breaker.faults),
            "breaker_opened": self.breaker.opened_total,
            "last_error": self.last_error,
            "adapters": sorted({*self.adapters, *self.declared_adapters}),
            "role": self.role,
        }
