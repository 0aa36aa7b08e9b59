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

import hashlib
import hmac
from collections.abc import Mapping

from gateway.config.features import ApiKeyConfig, AuthConfig
from gateway.errors import AuthenticationError, PermissionDeniedError
from gateway.request.caller import ANONYMOUS, Caller

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})  # and what the app adds (the dashboard's files)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def authenticate(
    config: AuthConfig, path: str, headers: Mapping[str, str], open_paths: frozenset[str] = OPEN_PATHS
) -> Caller:
    """The caller of `path`, or AuthenticationError / PermissionDeniedError; `open_paths` need no key."""
    if not config.enabled or path in open_paths:
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
