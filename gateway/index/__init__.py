"""Warm-prefix index: which replica holds which prefix blocks. See `base` for the interface."""

from __future__ import annotations

from gateway.index.base import IndexParams, WarmIndex, build_index
from gateway.index.memory import MemoryIndex

__all__ = ["IndexParams", "MemoryIndex", "WarmIndex", "build_index"]
