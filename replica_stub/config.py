"""The replica's settings: defaults, overlaid by an optional YAML file, overlaid by CLI flags.

The YAML file uses the flags' names in snake_case (`max_num_seqs: 64`), with the timing
model under `timing:` (`timing: {decode_base_ms: 20}`); unknown keys are errors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from replica_stub.engine.timing import TimingModel
from replica_stub.kv_events import ENCODINGS, ENDPOINT_SCHEMES, Encoding
from replica_stub.lora import Lora, parse_modules
from replica_stub.scheduler import BATCHING, Batching

DEFAULT_MAX_MODEL_LEN = 8192
DTYPES = ("auto", "bfloat16", "float32")  # the real engine's weights and KV cache (auto: see cpu_dtype)


@dataclass(frozen=True)
class StubConfig:
    model: str = "stub-model"
    host: str = "127.0.0.1"
    port: int = 8000
    replica_id: str = ""  # "" -> "replica-<port>"
    engine: str = "auto"  # "auto" -> "real" when the model is installed, else "sim"
    speedup: float = 1.0
    block_size: int = 16
    num_gpu_blocks: int = 4096
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 0  # 0 -> min(8192, KV capacity in tokens)
    batching: Batching = "continuous"  # "static": a batch runs until its longest request ends (see scheduler)
    sim_output_len: tuple[int, int] = (16, 256)
    kv_cache_mb: float = 256.0  # real engine: KV memory budget; sets num_gpu_blocks
    torch_threads: int = 0  # real engine: 0 -> min(2, CPU count)
    dtype: str = "auto"  # real engine: bfloat16 where the CPU has native bf16, else float32
    log_level: str = "info"
    kv_events_endpoint: str = ""  # "" -> no KV events; else the ZMQ PUB endpoint to bind
    kv_events_replay_endpoint: str = ""  # "" -> no replay; else the ZMQ ROUTER endpoint to bind
    kv_events_topic: str = ""
    kv_events_encoding: Encoding = "array"  # "array" (vLLM <= 0.11 tagged arrays) or "map" (newer tagged maps)
    kv_events_buffer_steps: int = 10_000  # batches kept for replay
    timing: TimingModel = field(default_factory=TimingModel)
    fail_on_marker: str = ""  # "" -> off; else a request whose body contains it gets 500 (an input-dependent fault)
    api_key: str = ""  # "" -> open; else /v1/* needs `Authorization: Bearer <it>` (vLLM's --api-key)
    lora_modules: tuple[str, ...] = ()  # "name=path" adapters (vLLM's --lora-modules), see replica_stub.lora

    @cached_property
    def loras(self) -> dict[str, Lora]:
        """The adapters served, by name (validated by `resolved`)."""
        return parse_modules(self.lora_modules, self.model)

    def resolved(self) -> StubConfig:
        """Fill derived defaults and check ranges; raises ValueError naming the setting."""
        capacity = self.block_size * self.num_gpu_blocks
        config = dataclasses.replace(
            self,
            replica_id=self.replica_id or f"replica-{self.port}",
            max_model_len=self.max_model_len or min(DEFAULT_MAX_MODEL_LEN, capacity),
        )
        if config.kv_cache_mb <= 0 or config.torch_threads < 0:
            raise ValueError("kv_cache_mb must be > 0 and torch_threads >= 0")
        if config.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {config.dtype!r}")
        for name in ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(config, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if config.batching not in BATCHING:
            raise ValueError(f"batching must be one of {', '.join(BATCHING)}, got {config.batching!r}")
        if config.speedup <= 0:
            raise ValueError("speedup must be > 0")
        if config.max_model_len > capacity:
            raise ValueError(
                f"max_model_len {config.max_model_len} exceeds the KV capacity "
                f"({config.num_gpu_blocks} blocks x {config.block_size} = {capacity} tokens)"
            )
        low, high = config.sim_output_len
        if not 1 <= low <= high:
            raise ValueError("sim_output_len must be [min, max] with 1 <= min <= max")
        config.timing.validate()
        config._check_kv_events()
        parse_modules(config.lora_modules, config.model)
        return config

    def _check_kv_events(self) -> None:
        for name in ("kv_events_endpoint", "kv_events_replay_endpoint"):
            value = getattr(self, name)
            if value and not value.startswith(ENDPOINT_SCHEMES):
                raise ValueError(f"{name} must start with {', '.join(ENDPOINT_SCHEMES)}, got {value!r}")
        if self.kv_events_replay_endpoint and not self.kv_events_endpoint:
            raise ValueError("kv_events_replay_endpoint needs kv_events_endpoint")
        if self.kv_events_encoding not in ENCODINGS:
            raise ValueError(f"kv_events_encoding must be one of {', '.join(ENCODINGS)}")
        if self.kv_events_buffer_steps < 1:
            raise ValueError("kv_events_buffer_steps must be >= 1")


def load_config(path: str | None, overrides: Mapping[str, Any]) -> StubConfig:
    """Defaults <- YAML file <- `overrides` (CLI flags that were given; timing keys flat)."""
    data: dict[str, Any] = {}
    if path:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: expected a mapping at the top level")
        data.update(loaded)
    timing_data = dict(data.pop("timing", None) or {})
    timing_fields = {f.name for f in dataclasses.fields(TimingModel)}
    for key, value in overrides.items():
        (timing_data if key in timing_fields else data)[key] = value
    known = {f.name for f in dataclasses.fields(StubConfig)} - {"timing"}
    unknown = [k for k in data if k not in known] + [f"timing.{k}" for k in timing_data if k not in timing_fields]
    if unknown:
        raise ValueError(f"{path or 'flags'}: unknown setting(s) {', '.join(unknown)}")
    for name in ("sim_output_len", "lora_modules"):
        if name in data:
            data[name] = tuple(data[name])
    return StubConfig(**data, timing=TimingModel(**timing_data)).resolved()
