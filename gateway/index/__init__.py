"""Warm-prefix index: which replica holds which prefix blocks. See `base` for the interface, `build` for
the store the config names. Imports config, prompt and support only."""

from __future__ import annotations

from gateway.index.base import WarmIndex
from gateway.index.build import build_index
from gateway.index.memory import MemoryIndex

__all__ = ["MemoryIndex", "WarmIndex", "build_index"]
