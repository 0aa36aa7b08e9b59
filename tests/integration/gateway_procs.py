"""Real processes for the gateway's integration tests: replica stubs and `python -m gateway serve`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from tests.helpers import Proc, free_port, python_module, wait_http

MODEL = "stub-model"
T = TypeVar("T")


@dataclass
class Stub:
    replica_id: str
    port: int
    model: str = MODEL
    speedup: float = 50
    proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *flags: str) -> Stub:
        self.proc = Proc(
            python_module(
                "replica_stub",
                "--port",
                str(self.port),
                "--model",
                self.model,
                "--engine",
                "sim",
                "--speedup",
                str(self.speedup),
                "--replica-id",
                self.replica_id,
                "--log-level",
                "warning",
                *flags,
            )
        )
        wait_http(f"{self.url}/health", self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def start_stub(replica_id: str, model: str = MODEL, speedup: float = 50, *flags: str) -> Stub:
    return Stub(replica_id, free_port(), model, speedup).start(*flags)


def pool(*replicas: tuple[str, str], policy: str = "round_robin") -> dict[str, Any]:
    return {"replicas": [{"url": url, "name": name} for name, url in replicas], "routing": {"policy": policy}}


@dataclass
class Gateway:
    config_path: Path
    port: int
    proc: Proc
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rewrite(self, data: dict[str, Any]) -> None:
        self.data = data
        self.config_path.write_text(yaml.safe_dump(data))

    def replicas(self, model: str = MODEL) -> dict[str, dict[str, Any]]:
        answer = httpx.get(f"{self.url}/admin/replicas", timeout=5).json()
        return {r["id"]: r for r in answer[model]["replicas"]}

    def stop(self) -> None:
        self.proc.stop()


# For tests whose claim is where requests go: a health probe slowed past its timeout by a loaded
# machine (the full suite, vLLM's engines on the same two cores) must not take a replica out, which
# moves the next request and reads as a routing choice. A replica that is down still goes in 0.3 s.
STEADY_HEALTH = {
    "interval_s": 0.1,
    "timeout_s": 2.0,
    "unhealthy_after": 3,
    "healthy_after": 1,
    "eject_after_failures": 3,
    "backoff_s": 0.2,
    "backoff_max_s": 0.5,
}


def start_gateway(
    tmp_path: Path, pools: dict[str, Any], *, flags: Sequence[str] = (), prefix: Sequence[str] = (), **sections: Any
) -> Gateway:
    """Serve `pools` with fast probes and scrapes; `sections` override whole top-level keys; `flags`
    go to `serve` (`--workers 2`); `prefix` runs it through a command that execs it (`prlimit ... --`)."""
    port = free_port()
    data: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "pools": pools,
        "health": {
            "interval_s": 0.1,
            "timeout_s": 0.5,
            "unhealthy_after": 1,
            "healthy_after": 1,
            "eject_after_failures": 1,
            "backoff_s": 0.2,
            "backoff_max_s": 0.5,
        },
        "load": {"interval_s": 0.1},
        "timeouts": {"connect_s": 1.0, "first_byte_s": 30.0, "idle_s": 30.0},
        **sections,
    }
    path = tmp_path / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = Proc([*prefix, *python_module("gateway", "serve", "--config", str(path), *flags)])
    gateway = Gateway(path, port, proc, data)
    wait_http(f"{gateway.url}/health", proc)
    return gateway


@contextmanager
def running() -> Iterator[Callable[[T], T]]:
    """Stop every tracked Stub/Gateway at the end, also when starting a later one failed."""
    started: list[Stub | Gateway] = []

    def track(item: T) -> T:
        started.append(item)  # type: ignore[arg-type]
        return item

    try:
        yield track
    finally:
        for item in reversed(started):
            item.stop()
