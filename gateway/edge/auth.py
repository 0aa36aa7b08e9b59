"""API keys: who is calling (a tenant) and whether they may use the admin routes.

The config holds only each key's sha256 hex digest (`printf %s "$KEY" | sha256sum`), so a leaked
config file leaks no key. `sha256_file:` instead names a file of digests, one a line (a mounted
Secret; `#` comments allowed): each is a key of that entry's tenant, with the entry's limits, so a
key rotates by adding the new line before removing the old; the file is read at load and on reload.
A presented key is hashed and compared with *every* configured digest by `hmac.compare_digest`, so
the time taken says nothing about how close a guess was or which entry it matched. With no keys
configured the gateway is open (local development). Keys never reach a log, and the caller's
`Authorization` header is not forwarded to the replicas while auth is on.

    GET /health, GET /ready, GET /metrics    open (orchestrator probes, Prometheus)
    GET /dashboard and its assets            open (no data: the page asks /admin/* with an admin key)
    /admin/*                                 an admin key
    everything else                          any configured key
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from gateway.admin.dashboard import DASHBOARD_PATHS
from gateway.config.secret_files import secret_lines
from gateway.errors import AuthenticationError, ConfigError, PermissionDeniedError
from gateway.request.caller import ANONYMOUS, Caller

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", *DASHBOARD_PATHS})
_HEX64 = re.compile(r"[0-9a-f]{64}")
_KEY = "auth"  # AuthConfig is the config's top-level `auth`


@dataclass(frozen=True)
class ApiKeyConfig:
    """YAML `auth.keys[]`: one client key by digest, or (`sha256_file`) a file of digests."""

    sha256: str = ""
    tenant: str = ""  # salts the prefix hash chain (routing.prefix.salt_by_tenant) and labels metrics
    admin: bool = False
    requests_per_minute: float = 0.0  # 0 = unlimited
    tokens_per_minute: float = 0.0  # prompt (estimated at admission) + completion tokens; 0 = unlimited
    sha256_file: str | None = None  # digests one a line, each a key like this entry; instead of sha256

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
                raise ConfigError("expected the key's sha256 as 64 lowercase hex digits (printf %s KEY | sha256sum)",
                                  key=origin)
        return found

    def validate(self, key: str) -> None:
        if self.sha256_file is not None and self.sha256:
            raise ConfigError("set sha256 or sha256_file, not both", key=f"{key}.sha256_file")
        if self.sha256_file is None and not self.sha256:
            raise ConfigError("required key is missing (or give sha256_file)", key=f"{key}.sha256")
        if not self.tenant:
            raise ConfigError("must not be empty", key=f"{key}.tenant")
        for name in ("requests_per_minute", "tokens_per_minute"):
            if getattr(self, name) < 0:
                raise ConfigError("must be >= 0", key=f"{key}.{name}")


@dataclass(frozen=True)
class AuthConfig:
    """YAML `auth`: no keys = no authentication."""

    keys: tuple[ApiKeyConfig, ...] = ()

    @cached_property
    def entries(self) -> tuple[ApiKeyConfig, ...]:
        """One entry per digest (each line of a file its own), read once per loaded config, by validate."""
        seen: set[str] = set()
        out = []
        for i, entry in enumerate(self.keys):
            for digest, origin in entry.digests(f"{_KEY}.keys[{i}]"):
                if digest in seen:
                    raise ConfigError("the same key is configured twice", key=origin)
                seen.add(digest)
                out.append(dataclasses.replace(entry, sha256=digest, sha256_file=None))
        return tuple(out)

    def validate(self, key: str) -> None:
        self.entries  # noqa: B018 - the files' digests now, at load, not on the event loop at the first request

    @property
    def enabled(self) -> bool:
        return bool(self.keys)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def authenticate(config: AuthConfig, path: str, headers: Mapping[str, str]) -> Caller:
    """The caller of `path`, or AuthenticationError / PermissionDeniedError."""
    if not config.enabled or path in OPEN_PATHS:
        return ANONYMOUS
    presented = _presented_key(headers)
    if presented is None:
        raise AuthenticationError("missing API key: send `Authorization: Bearer <key>`")
    digest = hash_key(presented).encode()
    found: ApiKeyConfig | None = None
    for entry in config.entries:  # no early exit: the same work whichever entry matches
        if hmac.compare_digest(digest, entry.sha256.encode()):
            found = entry
    if found is None:
        raise AuthenticationError("invalid API key")
    if path.startswith("/admin/") and not found.admin:
        raise PermissionDeniedError("this route needs an admin API key")
    return Caller(found)


def _presented_key(headers: Mapping[str, str]) -> str | None:
    value = headers.get("Authorization", "")
    scheme, _, token = value.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("X-API-Key") or None
