"""LoRA adapters the stub serves, as vLLM's `--enable-lora --lora-modules name=path ...` declares them.

A sim adapter is only a name, but one that behaves like an adapter where a router can see it: it
is listed in `/v1/models` with `parent` (the base model) and `root` (its path), a request names it
in `model` (an unknown name gets vLLM's 404), it seeds the engine's text differently, and it salts
the request's block hashes (vLLM puts the LoRA in every block hash's extra keys), so two adapters
never share cached blocks. Its KV events carry `lora_id` (1, 2, ... in flag order, as vLLM numbers
adapters loaded at start) and `lora_name`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from gateway.errors import NotFoundError


@dataclass(frozen=True, slots=True)
class Lora:
    lora_id: int
    name: str
    path: str

    @property
    def hash_root(self) -> int:
        """The seed of the adapter's first block hash (the base model's is 0)."""
        return xxhash.xxh3_64_intdigest(b"lora\x00" + self.name.encode())


def parse_modules(specs: Sequence[str], base_model: str) -> dict[str, Lora]:
    """`name=path` specs → adapters by name; ValueError naming the bad spec."""
    loras: dict[str, Lora] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"lora_modules: expected name=path, got {spec!r}")
        if name in loras or name == base_model:
            raise ValueError(f"lora_modules: {name!r} is already served")
        loras[name] = Lora(len(loras) + 1, name, path)
    return loras


def resolve(model: Any, served: str, loras: Mapping[str, Lora]) -> Lora | None:
    """The adapter a request's `model` names (None: the base model); vLLM's 404 for any other name."""
    if model is None or model == served:
        return None
    lora = loras.get(model) if isinstance(model, str) else None
    if lora is None:
        raise NotFoundError(f"The model `{model}` does not exist.", param="model")
    return lora


def cards(loras: Mapping[str, Lora], base_model: str, created: int) -> list[dict[str, Any]]:
    """The adapters' `/v1/models` entries, in vLLM's shape."""
    return [
        {
            "id": lora.name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": lora.path,
            "parent": base_model,
        }
        for lora in loras.values()
    ]
