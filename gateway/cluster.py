"""`affinity-gateway up`: a local cluster of child processes on loopback, for demos and manual tests.

N replica stubs (`python -m replica_stub`) and one gateway (`python -m gateway serve`) with a
generated config; their output is forwarded line by line with a `[name]` prefix; Ctrl-C or SIGTERM
stops them all. `ClusterSpec` is where `--gateways N` and `--redis URL` will go.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from types import FrameType

import yaml


@dataclass(frozen=True)
class ClusterSpec:
    replicas: int = 3
    port: int = 8000
    host: str = "127.0.0.1"
    policy: str = "prefix_affinity"
    model: str = "stub-model"
    engine: str = "sim"
    speedup: float = 1.0
    log_level: str = "info"


class _Child:
    def __init__(self, name: str, args: list[str]) -> None:
        self.name = name
        self.popen = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        threading.Thread(target=self._forward, daemon=True).start()

    def _forward(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            sys.stdout.write(f"[{self.name}] {line}")
            sys.stdout.flush()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()

    def wait(self, timeout: float) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


def build_config(spec: ClusterSpec, replica_ports: list[int]) -> dict[str, object]:
    replicas = [{"url": f"http://127.0.0.1:{port}", "name": f"replica-{i}"} for i, port in enumerate(replica_ports)]
    return {
        "listen": {"host": spec.host, "port": spec.port},
        "pools": {spec.model: {"replicas": replicas, "routing": {"policy": spec.policy}}},
        "health": {"interval_s": 1.0},
        "load": {"interval_s": 0.25},
        "logging": {"level": spec.log_level},
    }


def run_cluster(spec: ClusterSpec) -> int:
    children: list[_Child] = []
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    config_file = tempfile.NamedTemporaryFile("w", prefix="affinity-gateway-", suffix=".yaml", delete=False)
    try:
        ports = [_free_port() for _ in range(spec.replicas)]
        for i, port in enumerate(ports):
            children.append(_Child(f"replica-{i}", [
                sys.executable, "-m", "replica_stub", "--port", str(port), "--model", spec.model,
                "--engine", spec.engine, "--speedup", str(spec.speedup), "--replica-id", f"replica-{i}"]))
        for child, port in zip(children, ports):
            _wait_ready(f"http://127.0.0.1:{port}/health", child, stopping)
        yaml.safe_dump(build_config(spec, ports), config_file)
        config_file.close()
        gateway = _Child("gateway", [sys.executable, "-m", "gateway", "serve", "--config", config_file.name])
        children.append(gateway)
        url = f"http://{'127.0.0.1' if spec.host in ('0.0.0.0', '::') else spec.host}:{spec.port}"
        _wait_ready(f"{url}/health", gateway, stopping)
        print(_banner(spec, url, config_file.name), flush=True)
        while not stopping.is_set() and all(c.popen.poll() is None for c in children):
            stopping.wait(0.5)
        return 0 if stopping.is_set() else 1
    except RuntimeError as exc:
        print(f"affinity-gateway up: {exc}", file=sys.stderr)
        return 1
    finally:
        for child in children:
            child.stop()
        for child in children:
            child.wait(10)
        os.unlink(config_file.name)


def _banner(spec: ClusterSpec, url: str, config_path: str) -> str:
    return f"""
Affinity Gateway is up at {url}  ({spec.replicas} {spec.engine} replicas, policy {spec.policy}, config {config_path})

  curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{spec.model}", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 16}}'

  curl -s {url}/admin/replicas      # replica health and load
  curl -s {url}/metrics             # Prometheus

Ctrl-C stops everything.
"""


def _wait_ready(url: str, child: _Child, stopping: threading.Event, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stopping.is_set():
        if child.popen.poll() is not None:
            raise RuntimeError(f"{child.name} exited with code {child.popen.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{child.name} not ready at {url}" if not stopping.is_set() else "interrupted")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
