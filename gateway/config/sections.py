"""The config's top-level sections that shape the server itself: listen, health probes, load scrapes,
upstream timeouts, client limits, logging, metrics, admission, shutdown, readiness and tracing.

Each is a `gateway.config.schema.Section` (a frozen pydantic model) named `<Section>Config`, validated
from its YAML mapping; its `check` holds what its fields' types cannot say (ranges, one field against another).
"""

from __future__ import annotations

import importlib
from typing import Any, Literal
from urllib.parse import urlsplit

from gateway.config.schema import Section
from gateway.errors import ConfigError

LogLevel = Literal["debug", "info", "warning", "error"]


class ListenConfig(Section):
    host: str = "0.0.0.0"
    port: int = 8000
    workers: int = 1  # gateway processes on this port (`serve --workers N`, gateway.serving.workers)

    def check(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0..65535, got {self.port}", key="port")
        if self.workers < 1:
            raise ConfigError(f"must be an integer >= 1, got {self.workers}", key="workers")


class HealthConfig(Section):
    """Active probes flip a replica after N consecutive results; upstream faults trip its circuit breaker."""

    path: str = "/health"
    interval_s: float = 2.0
    timeout_s: float = 1.0
    unhealthy_after: int = 2
    healthy_after: int = 1
    eject_after_failures: int = 3  # upstream faults within `failure_window_s` that open the breaker
    failure_window_s: float = 10.0
    backoff_s: float = 1.0  # open this long, doubling per consecutive opening; then half-open (one trial)
    backoff_max_s: float = 30.0
    max_ejection_percent: int = 50  # the breakers never eject more of a pool than this (at least one replica)

    def check(self) -> None:
        positive(
            self,
            "interval_s",
            "timeout_s",
            "unhealthy_after",
            "healthy_after",
            "eject_after_failures",
            "failure_window_s",
            "backoff_s",
            "backoff_max_s",
        )
        if not 0 <= self.max_ejection_percent <= 100:
            raise ConfigError(f"must be an integer 0..100, got {self.max_ejection_percent}", key="max_ejection_percent")


class LoadConfig(Section):
    """Scrape of each replica's Prometheus /metrics (queue, running, KV usage)."""

    enabled: bool = True
    path: str = "/metrics"
    interval_s: float = 0.5
    timeout_s: float = 1.0

    def check(self) -> None:
        positive(self, "interval_s", "timeout_s")


class TimeoutsConfig(Section):
    """Upstream limits (gateway.relay.watch): a first byte may take a long prefill; silence mid-answer may not."""

    connect_s: float = 5.0
    first_byte_s: float = 300.0  # a stream's first chunk, a whole answer's headers; then retried elsewhere
    idle_s: float = 60.0  # longest gap between upstream bytes once the first came

    def check(self) -> None:
        positive(self, "connect_s", "first_byte_s", "idle_s")


class LimitsConfig(Section):
    """Bounds on what one client may send, and how slowly. The header limits apply on restart only."""

    max_body_bytes: int = 16 * 1024 * 1024
    max_retries: int = 1  # extra attempts on other replicas, only before the first byte
    max_header_bytes: int = 8190  # one request or header line
    max_headers: int = 128
    max_messages: int = 2048  # chat `messages` entries
    max_prompt_tokens: int = 0  # estimated from the prompt's characters (or counted token ids); 0 = no limit
    client_header_timeout_s: float = 10.0  # complete headers this soon after connecting or the last answer
    client_body_timeout_s: float = 30.0  # the whole body this soon after the headers, else 408
    client_write_timeout_s: float = 30.0  # a client that reads nothing of a stream this long is dropped
    # A replica's whole (non-streamed) answer is held in memory before it goes out: a larger one is 502
    # (streams are relayed as they come and are not bounded by it). Embeddings of many long inputs are the
    # largest legitimate answers; 64 MiB holds 2,000 of 1,024 dimensions.
    max_answer_bytes: int = 64 * 1024 * 1024

    def check(self) -> None:
        positive(
            self,
            "max_body_bytes",
            "max_answer_bytes",
            "max_header_bytes",
            "max_headers",
            "max_messages",
            "client_header_timeout_s",
            "client_body_timeout_s",
            "client_write_timeout_s",
        )
        for name in ("max_retries", "max_prompt_tokens"):
            if getattr(self, name) < 0:
                raise ConfigError("must be >= 0", key=name)


class LoggingConfig(Section):
    level: LogLevel = "info"
    format: Literal["json", "console"] = "json"
    requests: bool = True  # one event per request
    prompts: bool = False  # add the prompt text to the request event (never on by default)


class MetricsConfig(Section):
    enabled: bool = True


def positive(obj: Any, *names: str) -> None:
    """Each named field of `obj` must be > 0; the error names the field."""
    for name in names:
        if getattr(obj, name) <= 0:
            raise ConfigError(f"must be > 0, got {getattr(obj, name)}", key=name)


class AdmissionConfig(Section):
    """YAML `admission`."""

    max_in_flight_per_replica: int = 0  # 0 = no cap (and no queue unless a tenant is capped)
    max_in_flight_per_tenant: int = 0  # slots one tenant (API key's tenant) may hold per pool; 0 = no cap
    max_queue: int = 256  # requests waiting per pool and tenant; one more gets 429
    queue_timeout_s: float = 10.0  # longest wait in the queue, then 429
    retry_after_s: float = 1.0  # the Retry-After of those 429s
    borrow_factor: float = 2.0  # a tenant under its fair share may exceed max_in_flight_per_replica up to × this

    def check(self) -> None:
        for name in ("max_in_flight_per_replica", "max_in_flight_per_tenant", "max_queue"):
            if getattr(self, name) < 0:
                raise ConfigError("must be >= 0", key=name)
        if not self.borrow_factor >= 1:  # NaN too
            raise ConfigError(f"must be >= 1, got {self.borrow_factor}", key="borrow_factor")
        for name in ("queue_timeout_s", "retry_after_s"):
            if getattr(self, name) <= 0:
                raise ConfigError("must be > 0", key=name)


class ShutdownConfig(Section):
    """YAML `shutdown` (read once, at start)."""

    grace_s: float = 30.0  # accepted requests may run this long after SIGTERM
    ready_delay_s: float = 0.0  # /ready is 503 this long before the listener closes

    def check(self) -> None:
        if self.grace_s <= 0:
            raise ConfigError("must be > 0", key="grace_s")
        if self.ready_delay_s < 0:
            raise ConfigError("must be >= 0", key="ready_delay_s")


class ReadinessConfig(Section):
    """YAML `readiness`."""

    require_all_pools: bool = False  # 503 as soon as any one pool has no replica taking traffic


class TracingConfig(Section):
    """YAML `tracing`: where spans go (OTLP over HTTP) and how many traces are kept. Read at start only."""

    enabled: bool = False
    endpoint: str = "http://collector:4318"  # the collector's OTLP/HTTP base URL (`/v1/traces` is added)
    protocol: Literal["http/protobuf"] = "http/protobuf"
    sampling_ratio: float = 1.0  # of the traces the gateway starts; a client's sampled flag is followed
    service_name: str = "affinity-gateway"

    def check(self) -> None:
        url = urlsplit(self.endpoint)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ConfigError(f"expected an http(s) URL, got {self.endpoint!r}", key="endpoint")
        if not 0.0 <= self.sampling_ratio <= 1.0:
            raise ConfigError(f"must be 0..1, got {self.sampling_ratio}", key="sampling_ratio")
        if not self.service_name:
            raise ConfigError("must not be empty", key="service_name")
        if self.enabled:
            try:
                for module in ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter"):
                    importlib.import_module(module)
            except ImportError:
                raise ConfigError("needs the otel extra: pip install 'affinity-gateway[otel]'", key="enabled") from None


__all__ = [
    "AdmissionConfig",
    "HealthConfig",
    "LimitsConfig",
    "ListenConfig",
    "LoadConfig",
    "LogLevel",
    "LoggingConfig",
    "MetricsConfig",
    "ReadinessConfig",
    "ShutdownConfig",
    "TimeoutsConfig",
    "TracingConfig",
    "positive",
]
