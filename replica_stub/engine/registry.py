"""Engine registry: maps the `--engine` name to an implementation."""
from __future__ import annotations

from replica_stub.config import StubConfig
from replica_stub.engine.base import Engine
from replica_stub.engine.simulated import SimEngine

ENGINES = ("sim",)


def build_engine(config: StubConfig) -> Engine:
    if config.engine == "sim":
        return SimEngine(config.timing, speedup=config.speedup, output_len=config.sim_output_len)
    raise ValueError(f"unknown engine {config.engine!r} (known: {', '.join(ENGINES)})")
