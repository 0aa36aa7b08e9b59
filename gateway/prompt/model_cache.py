"""Where the project's real model (SmolLM2-135M-Instruct) lives once converted: the folder behind the
tokenizer alias `model:smollm2`. The replica stub's real engine writes it, `up --engine vllm` serves
it and the gateway reads its tokenizer from it; the product owns the path and the stub imports it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

CACHE_ENV = "REPLICA_STUB_MODEL_CACHE"


def converted_dir() -> Path:
    """Where the safetensors copy lives: $REPLICA_STUB_MODEL_CACHE, else inside the venv (so
    `make clean` drops it), else the user's cache dir when the venv is read-only (containers)."""
    root = os.environ.get(CACHE_ENV)
    if not root:
        user_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "affinity-gateway"
        root = str(Path(sys.prefix) / "model-cache") if os.access(sys.prefix, os.W_OK) else str(user_cache)
    return Path(root) / "SmolLM2-135M-Instruct"
