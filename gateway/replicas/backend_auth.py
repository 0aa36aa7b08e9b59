"""Backend credentials: the key a replica (a vLLM started with `--api-key`) wants, per pool or replica.

    pools.<model>.api_key_env: VLLM_KEY            # the key is in this environment variable
    pools.<model>.replicas[i].api_key_file: PATH   # or in this file (surrounding whitespace stripped)

A replica's own setting wins over its pool's (discovered replicas take the pool's). The key is read
when the config is loaded, so a missing variable or unreadable file is a config error naming the
key, and a reload re-reads it (key rotation). It goes upstream as `Authorization: Bearer <key>`
in place of whatever the client sent: the client's key is never forwarded to a keyed replica.
"""

from __future__ import annotations

from multidict import CIMultiDict

CLIENT_KEY_HEADERS = ("Authorization", "X-API-Key")


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
