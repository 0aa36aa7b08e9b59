"""Warm-prefix index: which replica holds which prefix blocks. See `base` for the interface."""

from __future__ import annotations

from gateway.config.features import IndexConfig
from gateway.index.base import WarmIndex, build_index
from gateway.index.memory import MemoryIndex

__all__ = ["IndexConfig", "MemoryIndex", "WarmIndex", "build_index"]
