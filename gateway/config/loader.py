"""The gateway's config file: YAML → frozen pydantic models, validated once, errors naming file and key.

Usage:
    config = load_config("config.yaml")          # raises ConfigError("config.yaml:pools.m.replicas[0].url: ...")
    config = load_config(path, env=os.environ)   # AFFINITY_GATEWAY_HOST / _PORT / _LOG_LEVEL win over the file;
                                                 # `${VAR}` in values comes from `env` (default os.environ)

`config.example.yaml` documents every key; unknown keys are errors. The sections live beside this module
(`sections`, `features`, `pools`, `policy_params`, `kubernetes`); this one holds the whole (`Config`)
and reads the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field

from gateway.config import schema
from gateway.config.env import FromEnv, interpolate, with_key_overrides
from gateway.config.features import (
    AuthConfig,
    HeadersConfig,
    IndexConfig,
    IndexStore,
    PrefixReportConfig,
    RedisConfig,
    RoutesConfig,
    SessionsConfig,
)
from gateway.config.model_names import ModelNames, check_adapters, check_names
from gateway.config.pools import PoolConfig
from gateway.config.schema import Section
from gateway.config.sections import (
    AdmissionConfig,
    HealthConfig,
    LimitsConfig,
    ListenConfig,
    LoadConfig,
    LoggingConfig,
    MetricsConfig,
    ReadinessConfig,
    ShutdownConfig,
    TimeoutsConfig,
    TracingConfig,
)
from gateway.config.yaml_text import load_yaml
from gateway.errors import ConfigError

ENV_PREFIX = "AFFINITY_GATEWAY_"


class Config(Section):
    pools: dict[str, PoolConfig]
    listen: ListenConfig = Field(default_factory=ListenConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    load: LoadConfig = Field(default_factory=LoadConfig)
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    index: IndexConfig = Field(default_factory=IndexConfig)  # the warm-prefix index store
    redis: RedisConfig | None = None  # the Redis the gateways share: index, quotas, token costs
    auth: AuthConfig = Field(default_factory=AuthConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    shutdown: ShutdownConfig = Field(default_factory=ShutdownConfig)
    headers: HeadersConfig = Field(default_factory=HeadersConfig)
    readiness: ReadinessConfig = Field(default_factory=ReadinessConfig)
    routes: RoutesConfig = Field(default_factory=RoutesConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    sessions: SessionsConfig = Field(default_factory=SessionsConfig)  # agent timelines (gateway.insights.sessions)
    prefix_report: PrefixReportConfig = Field(default_factory=PrefixReportConfig)  # gateway.insights.prefix_report

    def backend_key(self, model: str, replica_id: str) -> str | None:
        """The key to send to this replica of this model's pool, if there is one."""
        pool = self.pools.get(model)
        return pool.backend_key(replica_id) if pool is not None else None

    def index_store(self, model: str) -> IndexStore:
        """Where this model's pool keeps its warm-prefix tables (gateway.index.build)."""
        if self.index.store == "memory" or self.redis is None:
            return IndexStore(self.index)
        return IndexStore(self.index, self.redis.resolved_url, f"{self.redis.key_prefix}{model}:")

    @cached_property
    def model_names(self) -> ModelNames:
        """Which pool a request's `model` names (aliases, patterns, the default pool)."""
        return ModelNames.of({name: pool.aliases for name, pool in self.pools.items()}, self.routes.default_pool)

    def check(self) -> None:
        if not self.pools:
            raise ConfigError("at least one model pool is required", key="pools")
        if self.index.store == "redis" and self.redis is None:
            raise ConfigError("needs the top-level `redis` section (its url or url_file)", key="index.store")
        check_names({name: pool.aliases for name, pool in self.pools.items()}, self.routes.default_pool, "routes")
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
        data = load_yaml(text)  # aliases bounded before interpolation walks the document
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", file=path) from None
    except ConfigError as exc:
        raise exc.in_file(path) from None
    try:
        return parse_config(interpolate(data, os.environ if env is None else env), env)
    except ConfigError as exc:
        raise exc.in_file(path) from None


def parse_config(data: Any, env: Mapping[str, str] | None = None) -> Config:
    if isinstance(data, dict) and "state" in data:  # the section's name until the store was called what it is
        raise ConfigError(
            "renamed: the warm-prefix store is configured under `index` now, with the same keys", key="state"
        )
    _moved_to_redis(data.get("index") if isinstance(data, dict) else None)
    config = schema.build(Config, with_key_overrides(data, env or {}))
    return apply_env(config, env or {})


def _moved_to_redis(index: Any) -> None:
    """The shared Redis was `index.store: redis://...`, `index.redis_url_file` and `index.key_prefix`
    until it was named for what it is: the top-level `redis`, which quotas and token costs use too."""
    if not isinstance(index, dict):
        return
    store = index.get("store")
    if isinstance(store, str) and "://" in store:
        raise ConfigError(
            "moved: the Redis URL is the top-level `redis.url` now; `index.store: redis` uses it", key="index.store"
        )
    if "redis_url_file" in index:
        raise ConfigError(
            "moved: the Redis URL's file is the top-level `redis.url_file` now; `index.store: redis` uses it",
            key="index.redis_url_file",
        )
    if "key_prefix" in index:
        raise ConfigError(
            "moved: the Redis key namespace is the top-level `redis.key_prefix` now", key="index.key_prefix"
        )


_LISTEN = {"HOST": "host", "PORT": "port", "WORKERS": "workers"}


def apply_env(config: Config, env: Mapping[str, str]) -> Config:
    """AFFINITY_GATEWAY_HOST, _PORT, _WORKERS and _LOG_LEVEL override the file (containers set them), read
    and checked as the file's values are; a mistake names the variable."""
    listen = {key: FromEnv(text) for name, key in _LISTEN.items() if (text := env.get(ENV_PREFIX + name)) is not None}
    level = env.get(ENV_PREFIX + "LOG_LEVEL")
    logging = {"level": FromEnv(level.lower())} if level is not None else {}
    named = {key: f"env {ENV_PREFIX}{name}" for name, key in (*_LISTEN.items(), ("LOG_LEVEL", "level"))}
    made: dict[str, Callable[[], Section]] = {
        "listen": lambda: schema.changed(config.listen, listen, named, "listen"),
        "logging": lambda: schema.changed(config.logging, logging, named, "logging"),
        "tracing": lambda: otel_env(config.tracing, env),
    }
    update, errors = {}, []
    for section, make in made.items():  # every variable's mistake at once, as the file's
        try:
            update[section] = make()
        except ConfigError as exc:
            errors.append(exc)
    if errors:
        raise ConfigError.of(errors)
    return config.model_copy(update=update)


_SAMPLERS = {"always_on": 1.0, "parentbased_always_on": 1.0, "always_off": 0.0, "parentbased_always_off": 0.0}


def otel_env(tracing: TracingConfig, env: Mapping[str, str]) -> TracingConfig:
    """OpenTelemetry's own variables over the file's `tracing`, as every OTel SDK reads them: the OTLP endpoint
    (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT`), `OTEL_SERVICE_NAME`, and the
    sampler (`OTEL_TRACES_SAMPLER` always_on / always_off / traceidratio with `OTEL_TRACES_SAMPLER_ARG`, each
    also parentbased_: a client's sampled flag is followed either way). Tracing is switched on by the file."""
    changes: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        if "endpoint" not in changes and (endpoint := env.get(name)):
            changes["endpoint"], origin["endpoint"] = endpoint, f"env {name}"
    if service := env.get("OTEL_SERVICE_NAME"):
        changes["service_name"], origin["service_name"] = service, "env OTEL_SERVICE_NAME"
    if sampler := env.get("OTEL_TRACES_SAMPLER"):
        if sampler in _SAMPLERS:
            changes["sampling_ratio"], origin["sampling_ratio"] = _SAMPLERS[sampler], "env OTEL_TRACES_SAMPLER"
        elif sampler in ("traceidratio", "parentbased_traceidratio"):
            changes["sampling_ratio"] = FromEnv(env.get("OTEL_TRACES_SAMPLER_ARG", "1.0"))
            origin["sampling_ratio"] = "env OTEL_TRACES_SAMPLER_ARG"
        else:
            raise ConfigError(
                f"unsupported sampler {sampler!r} (known: {', '.join([*_SAMPLERS, 'traceidratio'])}, "
                "parentbased_traceidratio)",
                key="env OTEL_TRACES_SAMPLER",
            )
    return schema.changed(tracing, changes, origin, "tracing")


__all__ = ["ENV_PREFIX", "Config", "apply_env", "load_config", "parse_config"]
