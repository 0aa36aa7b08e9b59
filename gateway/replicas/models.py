"""Which LoRA adapters a replica serves, read from its own `GET /v1/models`: vLLM lists each adapter
as an entry whose `parent` is the base model and whose `root` is the adapter's path. Read at the
health probes' interval (`Monitor`); an answer that is not a model list keeps the last one read."""

from __future__ import annotations

import aiohttp

from gateway.replicas.replica import Replica


async def list_adapters(session: aiohttp.ClientSession, replica: Replica, headers: dict[str, str],
                        timeout_s: float) -> None:
    try:
        async with session.get(f"{replica.url}/v1/models", headers=headers,
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            listed = (await r.json(content_type=None)).get("data") if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
        return
    if isinstance(listed, list):
        replica.adapters = {e["id"]: e.get("root") if isinstance(e.get("root"), str) else None for e in listed
                            if isinstance(e, dict) and isinstance(e.get("id"), str) and e.get("parent")}
