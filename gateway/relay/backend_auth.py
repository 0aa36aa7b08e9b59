"""Backend credentials: the key a replica (a vLLM started with `--api-key`) wants, per pool or replica.

    pools.<model>.api_key_env: VLLM_KEY            # the key is in this environment variable
    pools.<model>.replicas[i].api_key_file: PATH   # or in this file (surrounding whitespace stripped)

A replica's own setting wins over its pool's (discovered replicas take the pool's). The key is read
when the config is loaded, so a missing variable or unreadable file is a config error naming the
key, and a reload re-reads it (key rotation). It goes upstream as `Authorization: Bearer <key>`
in place of whatever the client sent: the client's key is never forwarded to a keyed replica.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from multidict import CIMultiDict

from gateway.config.secret_files import read_secret_file
from gateway.errors import ConfigError

CLIENT_KEY_HEADERS = ("Authorization", "X-API-Key")


def read_key(env_name: str | None, file_path: str | None, key: str,
             env: Mapping[str, str] | None = None) -> str | None:
    """The configured key, or None when neither source is set; ConfigError naming `key` otherwise."""
    if env_name is not None and file_path is not None:
        raise ConfigError("set api_key_env or api_key_file, not both", key=f"{key}.api_key_env")
    if env_name is not None:
        value = (os.environ if env is None else env).get(env_name, "")
        if not value.strip():
            raise ConfigError(f"environment variable {env_name!r} is not set or empty", key=f"{key}.api_key_env")
        return value.strip()
    if file_path is not None:
        return read_secret_file(file_path, f"{key}.api_key_file")
    return None


def set_upstream_auth(headers: CIMultiDict[str], backend_key: str | None, strip_client_key: bool) -> None:
    """Replace the client's credentials by the replica's: the client's key goes no further than the gateway."""
    if backend_key is not None or strip_client_key:
        for name in CLIENT_KEY_HEADERS:
            headers.popall(name, None)
    if backend_key is not None:
        headers["Authorization"] = f"Bearer {backend_key}"


def auth_headers(backend_key: str | None) -> dict[str, str]:
    """Headers for the gateway's own calls to a replica (its model card)."""
    return {"Authorization": f"Bearer {backend_key}"} if backend_key is not None else {}
