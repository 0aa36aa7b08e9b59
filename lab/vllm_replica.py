"""Real vLLM replicas (its CPU build, installed by `make vllm` into `.vllm/`): how to start one.

Used by `affinity-gateway up --engine vllm` and by the interop tests (tests/vllm/). The flags
and environment are those the gateway needs and this hardware wants (see the README):
- KV events. vLLM binds only wildcard, ipc:// or inproc:// endpoints and *connects* to any
  other: given `tcp://127.0.0.1:5557` its PUB socket connects, nothing reaches a subscriber,
  while its replay socket binds. So the endpoints are `tcp://*:port` inside a loopback-only
  network namespace (where `*` reaches nothing else), and ipc:// sockets everywhere else;
  the gateway connects to `tcp://127.0.0.1:port` or the same ipc path.
- One core per replica where there are cores (`VLLM_CPU_OMP_THREADS_BIND`), `--dtype` by the
  same rule as the stub's (`cpu_dtype`), eager mode (torch.compile adds minutes of start-up and
  nothing for this model), 1 GiB of KV cache, prompt-token details (else no `cached_tokens`).
- Offline: no hub, no usage stats. `python -m vllm.entrypoints.openai.api_server`, because the
  `vllm` CLI fails for the `vllm-cpu` distribution (`PackageNotFoundError: vllm`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from gateway.prompt.model_cache import converted_dir
from lab.peers import isolated
from replica_stub.engine.cpu_dtype import resolve_dtype

VLLM_DIR = Path(os.environ.get("AFFINITY_VLLM_DIR", Path(__file__).resolve().parents[1] / ".vllm"))
BLOCK_TOKENS = 128  # the CPU backend's block size (forced by the platform)
MAX_MODEL_LEN = 4096
KV_CACHE_GIB = 1
COMPUTE_PROCESS = "VLLM::Worker"  # the process that runs the model (the engine core and API server only steer it)
START_TIMEOUT_S = 300.0  # ~50 s for two replicas on two idle cores; much more on a busy machine


def installed() -> bool:
    """`make vllm` stamps a finished install."""
    return (VLLM_DIR / ".installed").exists()


def model_dir() -> Path:
    """The project's converted SmolLM2 folder (config, safetensors, tokenizer, chat template)."""
    return converted_dir()


@dataclass(frozen=True)
class VLLMReplica:
    """One vLLM API server: its HTTP port, its KV-event ports (or ipc paths) and its core."""

    index: int
    port: int
    events_port: int
    replay_port: int
    run_dir: Path  # ipc sockets live here when not in a loopback-only namespace
    served_name: str = "smollm2"
    dev_mode: bool = False  # VLLM_SERVER_DEV_MODE: /reset_prefix_cache (tests)
    wildcard: bool | None = None  # tcp://* endpoints; None: where this process sees only loopback
    num_blocks: int | None = None  # KV capacity in blocks instead of 1 GiB (tests: evictions within seconds)
    log_level: str = "info"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _endpoints(self, bind: bool) -> tuple[str, str]:
        if self.wildcard if self.wildcard is not None else isolated():
            host = "*" if bind else "127.0.0.1"
            return f"tcp://{host}:{self.events_port}", f"tcp://{host}:{self.replay_port}"
        base = self.run_dir / f"vllm-{self.index}"
        return f"ipc://{base}-events", f"ipc://{base}-replay"

    def kv_events(self) -> dict[str, str]:
        """The gateway config's `kv_events` for this replica (where to connect)."""
        endpoint, replay = self._endpoints(bind=False)
        return {"endpoint": endpoint, "replay_endpoint": replay}

    def command(self) -> list[str]:
        endpoint, replay = self._endpoints(bind=True)
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": endpoint,
            "replay_endpoint": replay,
            "topic": "",
        }
        return [
            str(VLLM_DIR / "bin" / "python"),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir()),
            "--served-model-name",
            self.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            resolve_dtype("auto"),
            "--enforce-eager",
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--kv-events-config",
            json.dumps(events),
            "--uvicorn-log-level",
            "warning",
            *(["--num-gpu-blocks-override", str(self.num_blocks)] if self.num_blocks else []),
        ]

    def env(self) -> dict[str, str]:
        cores = os.cpu_count() or 1
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
            "VLLM_CPU_OMP_THREADS_BIND": str(self.index % cores),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_LOGGING_LEVEL": self.log_level.upper(),
        }
        if self.dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        return env
