"""RequestView: the request body parsed once, with what routing needs read out of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class RequestView:
    """Everything a policy may look at. `raw` (decoded of any Content-Encoding) is forwarded as it is;
    `body` is never re-serialised (but for a request that named its pool by an alias: gateway.routing.model_names)."""

    request_id: str
    endpoint: str  # "chat" | "completions" | "embeddings"
    model: str
    stream: bool
    body: dict[str, Any]
    raw: bytes
    tenant: str | None = None  # from the API key; salts the prefix hash chain when enabled
    adapter: str | None = None  # the LoRA adapter `model` named (then `model` is its pool's): gateway.routing.adapters
    session_key: str | None = None  # X-Session-ID header, `prompt_cache_key` or `user`
    session_source: str | None = None  # which of them: "header", "prompt_cache_key" or "user" (insights.sessions)
    prompt_tokens_estimate: int = 0
    block_hashes: tuple[int, ...] = field(default=())  # filled only for policies that need the prefix
    preamble_tokens: int = 0  # tokens of the blocks wholly inside the leading tools + system prompt
    preamble_key: int = 0  # chain hash of the last block inside the preamble (0: none); names the preamble
    tokens_per_block: float = 0.0  # prompt tokens one hashed block stands for
    key_kind: str = ""  # "tokens" (token-exact, comparable with KV events) or "characters"
    recorded: tuple[str, int] | None = None  # the replica its blocks were just recorded for, and how many were new
