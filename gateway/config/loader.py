"""The gateway's config file: YAML → frozen dataclasses, validated once, errors naming file and key.

Usage:
    config = load_config("config.yaml")          # raises ConfigError("config.yaml:pools.m.replicas[0].url: ...")
    config = load_config(path, env=os.environ)   # AFFINITY_GATEWAY_HOST / _PORT / _LOG_LEVEL win over the file;
                                                 # `${VAR}` in values comes from `env` (default os.environ)

`config.example.yaml` documents every key; unknown keys are errors.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml

from gateway.admin.readiness import ReadinessConfig
from gateway.config import schema
from gateway.config.env import interpolate
from gateway.config.kubernetes import KubernetesDiscovery, Role
from gateway.edge.auth import AuthConfig
from gateway.edge.routes import RoutesConfig
from gateway.errors import ConfigError
from gateway.index.base import IndexParams
from gateway.index.kv_events.subscriber import KVEventsConfig
from gateway.insights.prefix_report import PrefixReportConfig
from gateway.insights.sessions import SessionsConfig
from gateway.insights.token_costs import Prices
from gateway.observability.tracing import TracingConfig
from gateway.prompt.prefix_keys import PrefixParams
from gateway.relay.backend_auth import read_key
from gateway.relay.headers import HeadersConfig
from gateway.relay.phrase_chunking import StreamChunking
from gateway.routing.adapters import check_adapters
from gateway.routing.model_names import ModelNames, check_names
from gateway.routing.policies import build_policy
from gateway.serving.admission import AdmissionConfig
from gateway.serving.lifecycle import ShutdownConfig

ENV_PREFIX = "AFFINITY_GATEWAY_"
LogLevel = Literal["debug", "info", "warning", "error"]


@dataclass(frozen=True)
class ListenConfig:
    host: str = "0.0.0.0"
    port: int = 8000
    workers: int = 1  # gateway processes on this port (`serve --workers N`, gateway.serving.workers)

    def validate(self, key: str) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0..65535, got {self.port}", key=f"{key}.port")
        if self.workers < 1:
            raise ConfigError(f"must be an integer >= 1, got {self.workers}", key=f"{key}.workers")


@dataclass(frozen=True)
class ReplicaConfig:
    url: str
    name: str = ""  # defaults to host:port of `url`
    weight: float = 1.0
    kv_events: KVEventsConfig | None = None  # the replica's ZMQ KV-event feed: exact cache state
    api_key_env: str | None = None  # this replica's own key (vLLM --api-key), over the pool's
    api_key_file: str | None = None
    adapters: tuple[str, ...] = ()  # LoRA adapters this replica serves (gateway.routing.adapters)
    role: Role = "both"  # for later prefill/decode splits: shown in /admin and metrics, not yet routed on

    def validate(self, key: str) -> None:
        read_key(self.api_key_env, self.api_key_file, key)
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"expected an http(s) URL like http://10.0.0.5:8000, got {self.url!r}", key=f"{key}.url")
        if self.weight <= 0:
            raise ConfigError(f"weight must be > 0, got {self.weight}", key=f"{key}.weight")

    @property
    def replica_id(self) -> str:
        return self.name or urlsplit(self.url).netloc


@dataclass(frozen=True)
class RoutingConfig:
    policy: str = "prefix_affinity"  # the product's reason to exist is the default
    params: dict[str, Any] = field(default_factory=dict)
    prefix: PrefixParams = field(default_factory=PrefixParams)  # how prompts are hashed, for prefix policies
    explain_header: bool = False  # add X-Gateway-Route (each candidate's score) to every response


@dataclass(frozen=True)
class DiscoveryConfig:
    """YAML `pools.<model>.discovery`: replicas from a DNS name's A/AAAA records (a headless Service),
    or from the Kubernetes API (`kubernetes`); exactly one of the two.

    Every DNS address becomes replica `<address>:<port>`, re-resolved every `interval_s`; every
    Kubernetes endpoint becomes replica `<pod name>`, followed as the watch reports it.
    """

    dns: str | None = None
    kubernetes: KubernetesDiscovery | None = None
    port: int = 8000
    interval_s: float = 5.0
    scheme: Literal["http", "https"] = "http"
    weight: float = 1.0
    kv_events_port: int | None = None  # each replica publishes KV events on tcp://<address>:<this port>
    kv_events_replay_port: int | None = None  # ...and answers replays on this one

    @property
    def source(self) -> str:
        """Where the replicas come from, for log lines."""
        if self.kubernetes is not None:
            k8s = self.kubernetes
            where = k8s.service or ",".join(f"{k}={v}" for k, v in sorted(k8s.labels.items())) or k8s.pool_label
            return f"kubernetes:{k8s.namespace or '-'}/{where}"
        return f"dns:{self.dns}"

    def validate(self, key: str) -> None:
        if (self.dns is None) == (self.kubernetes is None):
            raise ConfigError("set exactly one of `dns` and `kubernetes`",
                              key=f"{key}.{'kubernetes' if self.kubernetes is not None else 'dns'}")
        if self.dns is not None and (not self.dns or "/" in self.dns or ":" in self.dns):
            raise ConfigError(f"expected a host name like replicas.default.svc, got {self.dns!r}", key=f"{key}.dns")
        for name in ("port", "kv_events_port", "kv_events_replay_port"):
            port = getattr(self, name)
            if port is not None and not 1 <= port <= 65535:
                raise ConfigError(f"port must be 1..65535, got {port}", key=f"{key}.{name}")
        if self.kv_events_replay_port is not None and self.kv_events_port is None:
            raise ConfigError("a replay port needs kv_events_port", key=f"{key}.kv_events_replay_port")
        _positive(self, key, "interval_s", "weight")


_EVENTS_NEED_TOKENS = "KV events carry token ids: set routing.prefix.tokenizer so requests are keyed by the same tokens"


@dataclass(frozen=True)
class PoolConfig:
    replicas: tuple[ReplicaConfig, ...] = ()
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    discovery: DiscoveryConfig | None = None  # adds the replicas DNS or the Kubernetes API finds
    api_key_env: str | None = None  # the replicas' key (vLLM --api-key), sent as Authorization: Bearer
    api_key_file: str | None = None
    aliases: tuple[str, ...] = ()  # more names for this pool: exact, or wildcard patterns (gateway.routing.model_names)
    adapters: tuple[str, ...] = ()  # LoRA adapters every replica of the pool serves (gateway.routing.adapters)
    stream_chunking: StreamChunking = field(default_factory=StreamChunking)  # phrases for voice agents
    stream_usage: bool = True  # ask for usage on every stream, dropped before the client (gateway.relay.stream_usage)
    prices: Prices | None = None  # money per million tokens: cost and cache savings (gateway.insights.token_costs)

    @cached_property
    def _backend_keys(self) -> tuple[str | None, dict[str, str]]:
        """Read once per loaded config (validated at load): the pool's key and each replica's own."""
        own = {r.replica_id: k for r in self.replicas
               if (k := read_key(r.api_key_env, r.api_key_file, "")) is not None}
        return read_key(self.api_key_env, self.api_key_file, ""), own

    def backend_key(self, replica_id: str) -> str | None:
        """The key to send to this replica, if its pool or itself has one."""
        pool_key, own = self._backend_keys
        return own.get(replica_id, pool_key)

    @property
    def has_kv_events(self) -> bool:
        """Whether any replica (static or discovered) publishes KV events."""
        return (any(r.kv_events is not None for r in self.replicas)
                or (self.discovery is not None and self.discovery.kv_events_port is not None))

    def validate(self, key: str) -> None:
        read_key(self.api_key_env, self.api_key_file, key)
        if not self.replicas and self.discovery is None:
            raise ConfigError("a pool needs at least one replica (or `discovery`)", key=f"{key}.replicas")
        seen: set[str] = set()
        for i, replica in enumerate(self.replicas):
            if replica.replica_id in seen:
                raise ConfigError(f"duplicate replica {replica.replica_id!r} (give each a distinct name)",
                                  key=f"{key}.replicas[{i}]")
            seen.add(replica.replica_id)
            if replica.kv_events is not None and self.routing.prefix.tokenizer is None:
                raise ConfigError(_EVENTS_NEED_TOKENS, key=f"{key}.replicas[{i}].kv_events")
        if self.discovery is not None and self.discovery.kv_events_port is not None \
                and self.routing.prefix.tokenizer is None:
            raise ConfigError(_EVENTS_NEED_TOKENS, key=f"{key}.discovery.kv_events_port")
        # Build once to validate the policy name and its parameters; the pool builds its own.
        build_policy(self.routing.policy, self.routing.params, f"{key}.routing")
        self._backend_keys  # noqa: B018 - read the key files now, at load, not on the event loop at the first request


@dataclass(frozen=True)
class HealthConfig:
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

    def validate(self, key: str) -> None:
        _positive(self, key, "interval_s", "timeout_s", "unhealthy_after", "healthy_after",
                  "eject_after_failures", "failure_window_s", "backoff_s", "backoff_max_s")


@dataclass(frozen=True)
class LoadConfig:
    """Scrape of each replica's Prometheus /metrics (queue, running, KV usage)."""

    enabled: bool = True
    path: str = "/metrics"
    interval_s: float = 0.5
    timeout_s: float = 1.0

    def validate(self, key: str) -> None:
        _positive(self, key, "interval_s", "timeout_s")


@dataclass(frozen=True)
class TimeoutsConfig:
    """Upstream limits (gateway.relay.watch): a first byte may take a long prefill; silence mid-answer may not."""

    connect_s: float = 5.0
    first_byte_s: float = 300.0  # a stream's first chunk, a whole answer's headers; then retried elsewhere
    idle_s: float = 60.0  # longest gap between upstream bytes once the first came

    def validate(self, key: str) -> None:
        _positive(self, key, "connect_s", "first_byte_s", "idle_s")


@dataclass(frozen=True)
class LimitsConfig:
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

    def validate(self, key: str) -> None:
        _positive(self, key, "max_body_bytes", "max_header_bytes", "max_headers", "max_messages",
                  "client_header_timeout_s", "client_body_timeout_s", "client_write_timeout_s")
        for name in ("max_retries", "max_prompt_tokens"):
            if getattr(self, name) < 0:
                raise ConfigError("must be >= 0", key=f"{key}.{name}")


@dataclass(frozen=True)
class LoggingConfig:
    level: LogLevel = "info"
    format: Literal["json", "console"] = "json"
    requests: bool = True  # one event per request
    prompts: bool = False  # add the prompt text to the request event (never on by default)


@dataclass(frozen=True)
class MetricsConfig:
    enabled: bool = True


@dataclass(frozen=True)
class Config:
    pools: dict[str, PoolConfig]
    listen: ListenConfig = field(default_factory=ListenConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    index: IndexParams = field(default_factory=IndexParams)  # the warm-prefix index store
    auth: AuthConfig = field(default_factory=AuthConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    shutdown: ShutdownConfig = field(default_factory=ShutdownConfig)
    headers: HeadersConfig = field(default_factory=HeadersConfig)
    readiness: ReadinessConfig = field(default_factory=ReadinessConfig)
    routes: RoutesConfig = field(default_factory=RoutesConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)
    sessions: SessionsConfig = field(default_factory=SessionsConfig)  # agent timelines (gateway.insights.sessions)
    prefix_report: PrefixReportConfig = field(default_factory=PrefixReportConfig)  # gateway.insights.prefix_report

    def backend_key(self, model: str, replica_id: str) -> str | None:
        """The key to send to this replica of this model's pool, if there is one."""
        pool = self.pools.get(model)
        return pool.backend_key(replica_id) if pool is not None else None

    @cached_property
    def model_names(self) -> ModelNames:
        """Which pool a request's `model` names (aliases, patterns, the default pool)."""
        return ModelNames.of({name: pool.aliases for name, pool in self.pools.items()}, self.routes.default_pool)

    def validate(self, key: str) -> None:
        if not self.pools:
            raise ConfigError("at least one model pool is required", key="pools")
        check_names({name: pool.aliases for name, pool in self.pools.items()}, self.routes.default_pool,
                          "routes")
        check_adapters(self.pools, list(self.model_names.exact))
        for name, pool in self.pools.items():
            if pool.discovery is not None and pool.discovery.kubernetes is not None:
                pool.discovery.kubernetes.check_pool(name, f"pools.{name}.discovery.kubernetes")


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> Config:
    """Read, validate and apply env overrides; every ConfigError carries the file name."""
    path = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config: {exc.strerror}", file=path) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", file=path) from None
    try:
        return parse_config(interpolate(data, os.environ if env is None else env), env)
    except ConfigError as exc:
        raise ConfigError(exc.reason, key=exc.key, file=path) from None


def parse_config(data: Any, env: Mapping[str, str] | None = None) -> Config:
    if isinstance(data, dict) and "state" in data:  # the section's name until the store was called what it is
        raise ConfigError("renamed: the warm-prefix store is configured under `index` now, with the same keys",
                          key="state")
    config = schema.build(Config, data)
    return apply_env(config, env or {})


def apply_env(config: Config, env: Mapping[str, str]) -> Config:
    """AFFINITY_GATEWAY_HOST, _PORT, _WORKERS and _LOG_LEVEL override the file (containers set them)."""
    listen, logging = config.listen, config.logging
    if (host := env.get(ENV_PREFIX + "HOST")) is not None:
        listen = dataclasses.replace(listen, host=host)
    if (port := env.get(ENV_PREFIX + "PORT")) is not None:
        listen = dataclasses.replace(listen, port=_int(port, "PORT"))
    if (workers := env.get(ENV_PREFIX + "WORKERS")) is not None:
        if (count := _int(workers, "WORKERS")) < 1:
            raise ConfigError(f"must be an integer >= 1, got {count}", key=f"env {ENV_PREFIX}WORKERS")
        listen = dataclasses.replace(listen, workers=count)
    if (level := env.get(ENV_PREFIX + "LOG_LEVEL")) is not None:
        level = schema.convert(LogLevel, level.lower(), f"env {ENV_PREFIX}LOG_LEVEL")
        logging = dataclasses.replace(logging, level=level)
    return dataclasses.replace(config, listen=listen, logging=logging)


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"expected an integer, got {text!r}", key=f"env {ENV_PREFIX}{name}") from None


def _positive(obj: Any, key: str, *names: str) -> None:
    for name in names:
        if getattr(obj, name) <= 0:
            raise ConfigError(f"must be > 0, got {getattr(obj, name)}", key=f"{key}.{name}")


__all__ = ["Config", "ConfigError", "DiscoveryConfig", "HealthConfig", "KubernetesDiscovery", "LimitsConfig",
           "ListenConfig", "LoadConfig",
           "LoggingConfig", "PoolConfig", "ReplicaConfig", "RoutingConfig", "TimeoutsConfig", "load_config",
           "parse_config"]
