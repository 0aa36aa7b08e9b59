"""What a replica's own `GET /v1/models` says: the base model's card (`max_model_len`, `root`, what
clients size requests by) and the LoRA adapters it serves (vLLM lists each as an entry whose
`parent` is the base model and whose `root` is the adapter's path). Read at the health probes'
interval (`Monitor`), so the gateway's `/v1/models` answers from memory; an answer that is not a
model list keeps the last one read."""

from __future__ import annotations

import aiohttp

from gateway.replicas.replica import Replica

CARD_FIELDS = ("max_model_len", "root")  # taken from a replica's own entry for its pool's model


async def list_models(
    session: aiohttp.ClientSession, replica: Replica, model: str, headers: dict[str, str], timeout_s: float
) -> None:
    try:
        async with session.get(
            f"{replica.url}/v1/models", headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as r:
            listed = (await r.json(content_type=None)).get("data") if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
        return
    if isinstance(listed, list):
        card = next((e for e in listed if isinstance(e, dict) and e.get("id") == model), {})
        replica.model_card = {k: card[k] for k in CARD_FIELDS if k in card}
        replica.adapters = {
            e["id"]: e.get("root") if isinstance(e.get("root"), str) else None
            for e in listed
            if isinstance(e, dict) and isinstance(e.get("id"), str) and e.get("parent")
        }
