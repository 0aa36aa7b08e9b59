"""The config's sections for features at the edge and beside the request path: client keys (`auth`),
extra routes (`routes`), response headers (`headers`), the warm-prefix index store (`index`), agent
sessions (`sessions`), the prefix report (`prefix_report`), and the Redis the gateways share (`redis`).

The features import their section from here (`gateway.edge.auth`, `gateway.edge.routes`, ...); the
route table below (`MODEL_ROUTES`, `RESERVED`) is the one `gateway.edge.routes` serves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal
from urllib.parse import urlsplit

from gateway.config.schema import Section
from gateway.config.secret_files import read_secret_file, secret_lines
from gateway.errors import ConfigError

_HEX64 = re.compile(r"[0-9a-f]{64}")


class ApiKeyConfig(Section):
    """YAML `auth.keys[]`: one client key by digest, or (`sha256_file`) a file of digests."""

    sha256: str = ""
    tenant: str = ""  # salts the prefix hash chain (routing.prefix.salt_by_tenant) and labels metrics
    admin: bool = False
    requests_per_minute: float = 0.0  # 0 = unlimited
    tokens_per_minute: float = 0.0  # prompt (estimated at admission) + completion tokens; 0 = unlimited
    sha256_file: str | None = None  # digests one a line, each a key like this entry; instead of sha256
    max_in_flight: int | None = None  # the tenant's slots per pool; none = admission.max_in_flight_per_tenant
    weight: int = 1  # turns per round when tenants wait for slots (weighted round robin)

    def digests(self, key: str) -> list[tuple[str, str]]:
        """(digest, the key naming where it came from) of this entry; reads `sha256_file`."""
        if self.sha256_file is None:
            found = [(self.sha256, f"{key}.sha256")]
        else:
            where = f"{key}.sha256_file"
            found = [(line, f"{where} line {n}") for n, line in secret_lines(self.sha256_file, where)]
            if not found:
                raise ConfigError(f"file {self.sha256_file!r} holds no digest, only comments", key=where)
        for digest, origin in found:
            if not _HEX64.fullmatch(digest):
                raise ConfigError(
                    "expected the key's sha256 as 64 lowercase hex digits (printf %s KEY | sha256sum)", key=origin
                )
        return found

    def check(self) -> None:
        if self.sha256_file is not None and self.sha256:
            raise ConfigError("set sha256 or sha256_file, not both", key="sha256_file")
        if self.sha256_file is None and not self.sha256:
            raise ConfigError("required key is missing (or give sha256_file)", key="sha256")
        if not self.tenant:
            raise ConfigError("must not be empty", key="tenant")
        for name in ("requests_per_minute", "tokens_per_minute"):
            if getattr(self, name) < 0:
                raise ConfigError("must be >= 0", key=name)
        if self.max_in_flight is not None and self.max_in_flight < 0:
            raise ConfigError("must be >= 0 (0 = no cap)", key="max_in_flight")
        if self.weight < 1:
            raise ConfigError("must be >= 1", key="weight")


class AuthConfig(Section):
    """YAML `auth`: no keys = no authentication."""

    keys: tuple[ApiKeyConfig, ...] = ()
    # The rate limits' sliding window: the *_per_minute rates hold over any window this long (restart only).
    # 60 s is a minute; a shorter one only makes tests of the window fast (tests/integration).
    rate_limit_window_s: float = 60.0

    @cached_property
    def entries(self) -> tuple[ApiKeyConfig, ...]:
        """One entry per digest (each line of a file its own), read once per loaded config, by check."""
        seen: set[str] = set()
        out = []
        for i, entry in enumerate(self.keys):
            for digest, origin in entry.digests(f"keys[{i}]"):
                if digest in seen:
                    raise ConfigError("the same key is configured twice", key=origin)
                seen.add(digest)
                out.append(entry.model_copy(update={"sha256": digest, "sha256_file": None}))
        return tuple(out)

    def check(self) -> None:
        if not 0 < self.rate_limit_window_s <= 3600:
            raise ConfigError(
                f"must be seconds in (0, 3600], got {self.rate_limit_window_s}", key="rate_limit_window_s"
            )
        self.entries  # noqa: B018 - the files' digests now, at load, not on the event loop at the first request
        shares: dict[str, tuple[int | None, int]] = {}
        for i, entry in enumerate(self.keys):  # admission counts and serves a tenant as one, whichever key it uses
            share = shares.setdefault(entry.tenant, (entry.max_in_flight, entry.weight))
            if share != (entry.max_in_flight, entry.weight):
                raise ConfigError(
                    f"keys of tenant {entry.tenant!r} must agree on max_in_flight and weight", key=f"keys[{i}]"
                )

    @property
    def enabled(self) -> bool:
        return bool(self.keys)


class HeadersConfig(Section):
    """YAML `headers`: what a client learns from response headers (public deployments turn the ids off)."""

    drop_response: tuple[str, ...] = ()  # more replica response headers never to pass on (e.g. debug ones)
    replica_id: bool = True  # X-Replica-Id: the replica that answered
    affinity_reason: bool = True  # X-Affinity-Reason: why the policy chose it
    session: str = "X-Session-ID"  # the request header naming a conversation (session_affinity's key)

    def check(self) -> None:
        if not _TOKEN.fullmatch(self.session):
            raise ConfigError(f"not a header name: {self.session!r}", key="session")
        for i, name in enumerate(self.drop_response):
            if not _TOKEN.fullmatch(name):
                raise ConfigError(f"not a header name: {name!r}", key=f"drop_response[{i}]")

    @cached_property
    def dropped(self) -> frozenset[str]:
        """`drop_response`, lower-cased (`gateway.relay.headers.response_drop` adds the fixed set)."""
        return frozenset(name.lower() for name in self.drop_response)


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 field name


MODEL_ROUTES: dict[str, str] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
    "/v1/rerank": "rerank",
    "/rerank": "rerank",
    "/v2/rerank": "rerank",
    "/v1/score": "score",
    "/score": "score",
    "/pooling": "pooling",
    "/classify": "classify",
    "/v1/audio/transcriptions": "audio",
    "/v1/audio/translations": "audio",  # multipart: the form's `model`
}


RESERVED = ("/health", "/ready", "/metrics", "/admin/", "/v1/models", "/dashboard", "/dashboard/")  # the gateway's own


_PATH = re.compile(r"(/[A-Za-z0-9._~-]+)+")


class RoutesConfig(Section):
    """YAML `routes`."""

    passthrough: tuple[str, ...] = ()  # more POST paths forwarded to the pool named by the body's `model`
    default_pool: str | None = None  # where a `model` no pool or alias names goes (gateway.routing.model_names)

    def check(self) -> None:
        for i, path in enumerate(self.passthrough):
            where = f"passthrough[{i}]"
            if not _PATH.fullmatch(path):
                raise ConfigError(f"expected a path like /v1/something, got {path!r}", key=where)
            if (
                path in MODEL_ROUTES
                or any(path == r or path.startswith(r) for r in RESERVED if r.endswith("/"))
                or path in RESERVED
            ):
                raise ConfigError(f"{path} is already a gateway route", key=where)
            if path in self.passthrough[:i]:
                raise ConfigError(f"{path} is listed twice", key=where)


class SessionsConfig(Section):
    """YAML `sessions` (read at start)."""

    enabled: bool = True
    max_sessions: int = 1000  # sessions kept, least recently active dropped first
    max_requests: int = 64  # hops kept per session (its totals count them all)
    idle_s: float = 300.0  # a session this long without a request has ended (metrics observed)
    infer: bool = True  # a request without a session key joins the session whose prompt it extends

    def check(self) -> None:
        for name in ("max_sessions", "max_requests"):
            if getattr(self, name) < 1:
                raise ConfigError(f"must be an integer >= 1, got {getattr(self, name)}", key=name)
        if self.idle_s <= 0:
            raise ConfigError(f"must be > 0, got {self.idle_s}", key="idle_s")


class PrefixReportConfig(Section):
    """YAML `prefix_report` (read at start)."""

    enabled: bool = True
    families: int = 128  # (tenant, pool) pairs with samples kept, and findings kept; least recently seen go
    samples: int = 8  # prompts kept per (tenant, pool), one per content family, to compare new ones with
    queue: int = 64  # finished requests waiting for analysis; more are skipped
    min_tokens: int = 256  # fewer shared tokens after the divergence are no finding

    def check(self) -> None:
        for name in ("families", "samples", "queue", "min_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"must be an integer >= 1, got {getattr(self, name)}", key=name)


_REDIS_SCHEMES = ("redis", "rediss", "unix")


class RedisConfig(Section):
    """YAML top-level `redis`: the one Redis the gateways share. When it is set, the gateways share their
    token-cost counters (`gateway.insights.shared_usage`) and, with client keys, their quotas
    (`gateway.edge.shared_quota`); `index.store: redis` keeps the warm-prefix index there too."""

    url: str | None = None  # redis://host:port/db (rediss://, unix:// too)
    url_file: str | None = None  # or the URL (with its password) in this file: a mounted Secret
    key_prefix: str = "affinity:"  # every key and channel of the gateways starts with this
    response_ttl_s: float = 86400.0  # a stored response's home (`gateway.relay.shared_homes`) is kept this long

    @cached_property
    def resolved_url(self) -> str:
        """`url`, or the URL in `url_file`: read once per loaded config, by check."""
        if self.url_file is not None:
            return read_secret_file(self.url_file, "url_file")
        assert self.url is not None, "validated: url or url_file"
        return self.url

    def check(self) -> None:
        if not self.response_ttl_s > 0:
            raise ConfigError(f"must be a number of seconds > 0, got {self.response_ttl_s}", key="response_ttl_s")
        if (self.url is None) == (self.url_file is None):
            raise ConfigError("set url or url_file (one of them)", key="url")
        if self.url_file is not None:
            if urlsplit(self.resolved_url).scheme not in _REDIS_SCHEMES:  # a secret: not in the message
                raise ConfigError("the file must hold a redis://, rediss:// or unix:// URL", key="url_file")
        elif urlsplit(self.resolved_url).scheme not in _REDIS_SCHEMES:
            raise ConfigError(f"expected a redis://, rediss:// or unix:// URL, got {self.url!r}", key="url")


class IndexConfig(Section):
    """YAML top-level `index`: where the warm-prefix tables live, and how a shared store is used."""

    store: Literal["memory", "redis"] = "memory"  # memory (one gateway) or the top-level `redis` (shared by many)
    capacity_blocks: int = 65536  # per replica, until set_capacity() learns the real KV pool size
    ttl_s: float = 3600.0  # a Redis table untouched this long disappears (removed replicas)
    timeout_s: float = 0.05  # Redis socket timeout; on expiry the lookup falls back to the local table
    max_pending_writes: int = 10000  # records queued for Redis while it is slow or down
    reconnect_max_s: float = 5.0  # backoff cap between reconnect attempts
    mirror: bool = True  # keep every table in memory, fed by the others' writes: lookups skip Redis

    def check(self) -> None:
        for name in ("capacity_blocks", "max_pending_writes"):
            if getattr(self, name) < 1:
                raise ConfigError("must be at least 1", key=name)
        for name in ("ttl_s", "timeout_s", "reconnect_max_s"):
            if getattr(self, name) <= 0:
                raise ConfigError("must be > 0", key=name)


@dataclass(frozen=True)
class IndexStore:
    """Where one pool's warm-prefix tables live (`Config.index_store`; not a YAML section): in memory
    (`url` None), or in the shared Redis under `<redis.key_prefix><model>:`, so each pool's mirror
    follows its own replicas only. The URL is resolved: a rotated `redis.url_file` makes a new store."""

    params: IndexConfig = field(default_factory=IndexConfig)
    url: str | None = None
    key_prefix: str = "affinity:"


__all__ = [
    "MODEL_ROUTES",
    "RESERVED",
    "ApiKeyConfig",
    "AuthConfig",
    "HeadersConfig",
    "IndexConfig",
    "IndexStore",
    "PrefixReportConfig",
    "RedisConfig",
    "RoutesConfig",
    "SessionsConfig",
]
