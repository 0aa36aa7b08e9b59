"""`affinity-gateway up`: a local cluster of child processes on loopback, for demos and manual tests.

N replica stubs (`python -m replica_stub`; with `--engine vllm` real vLLM API servers, see
`lab.vllm_replica`) and one or more gateways (`python -m gateway serve`, on
ports `port`, `port+1`, ...) sharing one generated config; their output is forwarded line by line
with a `[name]` prefix; Ctrl-C or SIGTERM stops them all, and a SIGKILL of `up` takes every
child's process tree with it (`lab.tether`). With `--redis URL` the gateways share their
warm-prefix tables through that Redis (`--redis` alone starts a private redis-server), which is the
topology of `deploy/docker-compose.yml` as plain processes.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from lab import vllm_replica
from lab.core_budget import CoreBudget
from lab.peers import Peer, peer_env
from lab.tether import Tethered


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
    gateways: int = 1
    redis: str | None = None  # shared index: redis:// URL, START_REDIS = a private redis-server, None = memory
    workers: int = 1  # processes per gateway (`serve --workers N`)
    kv_events: bool = True  # replicas publish KV events; the gateway keys prompts by the model's tokens
    num_gpu_blocks: int | None = None  # replicas' KV capacity (None: the stub's default)
    stub_flags: tuple[str, ...] = ()  # more replica-stub flags, e.g. ("--batching", "static")
    policy_params: Mapping[str, Any] = field(default_factory=dict)  # the pool's routing params
    peer: Peer | None = None  # another router in front of the replicas instead of our gateway(s), with `policy`
    replica_cpu: float | None = None  # vLLM replicas each capped at this share of a core (lab.core_budget)


START_REDIS = "start"


class _Child:
    def __init__(self, name: str, args: list[str], env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.tethered = Tethered(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**(env or os.environ), "PYTHONUNBUFFERED": "1"},
        )
        self.popen = self.tethered.popen
        threading.Thread(target=self._forward, daemon=True).start()

    def _forward(self) -> None:
        assert self.popen.stdout is not None
        with self.popen.stdout:  # closed at the end of the child's output, not left to the collector
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
        self.tethered.release()


def build_config(
    spec: ClusterSpec,
    replica_ports: list[int],
    store: str = "memory",
    event_ports: list[tuple[int, int]] | None = None,
    kv_events: list[dict[str, str]] | None = None,
) -> dict[str, object]:
    """One config for every gateway; each gets its own port through `--port`. With `event_ports`
    ((publisher, replay) per replica) or `kv_events` (each replica's config section) the pool
    subscribes to the replicas' KV events."""
    replicas: list[dict[str, object]] = [
        {"url": f"http://127.0.0.1:{port}", "name": f"replica-{i}"} for i, port in enumerate(replica_ports)
    ]
    routing: dict[str, object] = {"policy": spec.policy}
    if spec.policy_params:
        routing["params"] = dict(spec.policy_params)
    events = kv_events or [
        {"endpoint": f"tcp://127.0.0.1:{pub}", "replay_endpoint": f"tcp://127.0.0.1:{replay}"}
        for pub, replay in event_ports or []
    ]
    if events:
        for replica, section in zip(replicas, events):
            replica["kv_events"] = section
        prefix: dict[str, object] = {"tokenizer": "sim" if spec.engine == "sim" else "model:smollm2"}
        if spec.engine == "vllm":
            prefix["block_tokens"] = vllm_replica.BLOCK_TOKENS
        routing["prefix"] = prefix
    shared: dict[str, object] = {} if store == "memory" else {"redis": {"url": store}}
    return {
        "listen": {"host": spec.host, "port": spec.port},
        "pools": {spec.model: {"replicas": replicas, "routing": routing}},
        "health": {"interval_s": 1.0},
        "load": {"interval_s": 0.25},
        "logging": {"level": spec.log_level},
        "index": {"store": "memory" if store == "memory" else "redis"},
        **shared,
    }


def run_cluster(spec: ClusterSpec) -> int:
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        with started(spec, stopping) as cluster:
            print(_banner(spec, cluster.urls, cluster.store, cluster.config_path), flush=True)
            while not stopping.is_set() and all(c.popen.poll() is None for c in cluster.children):
                stopping.wait(0.5)
        return 0 if stopping.is_set() else 1
    except RuntimeError as exc:
        print(f"affinity-gateway up: {exc}", file=sys.stderr)
        return 1


@dataclass
class Cluster:
    urls: list[str]  # the gateways
    replicas: list[str]  # the replicas, replica-0 first
    store: str
    config_path: str
    children: list[_Child]


@contextmanager
def started(spec: ClusterSpec, stopping: threading.Event | None = None) -> Iterator[Cluster]:
    """Start the cluster, yield it once every process is ready, stop it all on exit (also
    `affinity-gateway bench --compare`, one fresh cluster per policy). RuntimeError if a
    process dies or is not ready in time."""
    stopping = stopping or threading.Event()
    children: list[_Child] = []
    config_file = tempfile.NamedTemporaryFile("w", prefix="affinity-gateway-", suffix=".yaml", delete=False)
    run_dir = Path(tempfile.mkdtemp(prefix="affinity-up-"))  # vLLM's ipc sockets
    budget: CoreBudget | None = None
    try:
        budget = CoreBudget(spec.replica_cpu) if spec.replica_cpu is not None else None
        store = _start_redis(spec, children, stopping) if spec.redis == START_REDIS else spec.redis or "memory"
        ports = [free_port() for _ in range(spec.replicas)]
        events = [(free_port(), free_port()) for _ in ports] if spec.kv_events else []
        sections: list[dict[str, str]] = []
        if spec.engine == "vllm":
            sections = _start_vllm(spec, ports, events, run_dir, children, stopping, budget)
        else:
            replicas = [_stub(spec, i, port, events[i] if events else None) for i, port in enumerate(ports)]
            children.extend(replicas)
            for i in range(len(replicas)):
                for attempt in range(3):
                    try:
                        _wait_ready(f"http://127.0.0.1:{ports[i]}/health", replicas[i], stopping)
                        break
                    except RuntimeError:
                        if replicas[i].popen.poll() is None or attempt == 2 or stopping.is_set():
                            raise
                    # A port probed free can be taken (another process's outgoing connection) before the
                    # stub binds it, and the stub exits at start: start it again on fresh ports.
                    ports[i] = free_port()
                    if events:
                        events[i] = (free_port(), free_port())
                    replicas[i] = _stub(spec, i, ports[i], events[i] if events else None)
                    children.append(replicas[i])
        host = "127.0.0.1" if spec.host in ("0.0.0.0", "::") else spec.host
        urls = []
        if spec.peer is not None:
            urls.append(_start_peer(spec, spec.peer, ports, children, stopping))
        yaml.safe_dump(build_config(spec, ports, store, events, sections), config_file)
        config_file.close()
        for i in range(spec.gateways if spec.peer is None else 0):
            name = "gateway" if spec.gateways == 1 else f"gateway-{i}"
            gateway = _Child(name, gateway_command(spec, config_file.name, i))
            children.append(gateway)
            urls.append(f"http://{host}:{spec.port + i}")
            _wait_ready(f"{urls[-1]}/health", gateway, stopping)
        yield Cluster(urls, [f"http://127.0.0.1:{port}" for port in ports], store, config_file.name, children)
    finally:
        for child in reversed(children):  # gateways first, Redis last: a stopping gateway still flushes
            child.stop()
        for child in reversed(children):
            child.wait(10)
        if budget is not None:
            budget.close()
        config_file.close()
        os.unlink(config_file.name)
        shutil.rmtree(run_dir, ignore_errors=True)


def _stub(spec: ClusterSpec, i: int, port: int, events: tuple[int, int] | None) -> _Child:
    return _Child(
        f"replica-{i}",
        [
            sys.executable,
            "-m",
            "replica_stub",
            "--port",
            str(port),
            "--model",
            spec.model,
            "--engine",
            spec.engine,
            "--speedup",
            str(spec.speedup),
            "--replica-id",
            f"replica-{i}",
            "--log-level",
            spec.log_level,
            *_engine_flags(spec),
            *spec.stub_flags,
            *_replica_flags(spec, events),
        ],
    )


def gateway_command(spec: ClusterSpec, config_path: str, index: int) -> list[str]:
    """Gateway `index` of the cluster: its own port, `spec.workers` processes on it."""
    return [
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        config_path,
        "--port",
        str(spec.port + index),
        "--workers",
        str(spec.workers),
    ]


def _start_vllm(
    spec: ClusterSpec,
    ports: list[int],
    events: list[tuple[int, int]],
    run_dir: Path,
    children: list[_Child],
    stopping: threading.Event,
    budget: CoreBudget | None,
) -> list[dict[str, str]]:
    """N vLLM API servers started together (start-up is mostly imports, ~50 s), each in its share of a core if
    `budget` says one; their `kv_events` sections."""
    if not vllm_replica.installed():
        raise RuntimeError(f"--engine vllm needs vLLM's CPU build in {vllm_replica.VLLM_DIR} (run `make vllm`)")
    replicas = [
        vllm_replica.VLLMReplica(
            i,
            port,
            *(events[i] if events else (free_port(), free_port())),
            run_dir=run_dir,
            served_name=spec.model,
            num_blocks=spec.num_gpu_blocks,
            log_level=spec.log_level,
        )
        for i, port in enumerate(ports)
    ]
    named = [(f"vllm-{r.index}", r) for r in replicas]
    started_children = [
        _Child(name, budget.wrapped(name, r.command()) if budget else r.command(), env=r.env()) for name, r in named
    ]
    children.extend(started_children)
    for child, replica in zip(started_children, replicas):
        _wait_ready(f"{replica.url}/health", child, stopping, vllm_replica.START_TIMEOUT_S)
    if budget is not None:
        budget.confine_to(vllm_replica.COMPUTE_PROCESS)
    return [r.kv_events() for r in replicas] if events else []


def _start_peer(
    spec: ClusterSpec, peer: Peer, ports: list[int], children: list[_Child], stopping: threading.Event
) -> str:
    """Another router in front of the replicas, on `spec.port`; returns its URL once it routes."""
    workers = [f"http://127.0.0.1:{port}" for port in ports]
    child = _Child(peer.name, peer.command(spec.policy, spec.port, workers, free_port()), env=peer_env())
    children.append(child)
    url = f"http://127.0.0.1:{spec.port}"
    _wait_ready(f"{url}/v1/models", child, stopping)
    return url


def _start_redis(spec: ClusterSpec, children: list[_Child], stopping: threading.Event) -> str:
    """A private, non-persistent redis-server on a free loopback port; returns its URL."""
    import redis  # only `up --redis` needs the client here

    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("--redis without a URL needs redis-server on PATH (or pass --redis redis://host:6379/0)")
    port = free_port()
    quiet = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel", "warning"]
    child = _Child("redis", [binary, "--port", str(port), *quiet])
    children.append(child)
    client = redis.Redis(port=port, socket_timeout=1.0)
    deadline = time.monotonic() + 10.0
    try:
        while True:
            try:
                client.ping()
                return f"redis://127.0.0.1:{port}/0"
            except redis.ConnectionError:
                if child.popen.poll() is not None or stopping.is_set() or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {port}") from None
                time.sleep(0.05)
    finally:
        client.close()


def _banner(spec: ClusterSpec, urls: list[str], store: str, config_path: str) -> str:
    url = urls[0]
    evidence = "exact cache state from KV events" if spec.kv_events else "cache state from routing history"
    gateways = "" if len(urls) == 1 else f"  gateways: {', '.join(urls)} (send to any; they share {store})\n"
    if spec.workers > 1:
        gateways += f"  {spec.workers} worker processes per gateway port (serve --workers, docs/SCALING.md)\n"
    return f"""
Affinity Gateway is up at {url}  ({spec.replicas} {spec.engine} replicas, policy {spec.policy}, {evidence},
  config {config_path})
{gateways}
  curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{spec.model}", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 16}}'

  curl -s {url}/admin/replicas      # replica health and load
  curl -s {url}/metrics             # Prometheus

Ctrl-C stops everything.
"""


def _engine_flags(spec: ClusterSpec) -> list[str]:
    """Real-model replicas share this machine's cores: give each its share of torch threads."""
    if spec.engine != "real":
        return []
    return ["--torch-threads", str(max(1, (os.cpu_count() or 1) // spec.replicas))]


def _replica_flags(spec: ClusterSpec, events: tuple[int, int] | None) -> list[str]:
    flags = [] if spec.num_gpu_blocks is None else ["--num-gpu-blocks", str(spec.num_gpu_blocks)]
    if events is not None:
        flags += [
            "--kv-events-endpoint",
            f"tcp://127.0.0.1:{events[0]}",
            "--kv-events-replay-endpoint",
            f"tcp://127.0.0.1:{events[1]}",
        ]
    return flags


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


def free_port() -> int:
    """A free TCP port on loopback (the OS picks; it is free again once the probe socket closes)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
