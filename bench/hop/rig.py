"""The rig every hop measurement stands on: three zero-delay replicas, and our gateway's config."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import yaml

from bench.hop.processes import running
from lab.cluster import free_port

MODEL = "bench-model"
SCRIPT = Path(__file__).with_name("completions.lua")  # wrk's requests: a different prompt each
RESULT = re.compile(
    r"WRK_RESULT requests=(\d+) errors=(\d+) status=(\d+) seconds=([\d.]+) p50_ms=([\d.]+) p99_ms=([\d.]+)"
)


def fake_replicas(stack: ExitStack, count: int = 3) -> list[str]:
    """Start `count` zero-delay replicas that live as long as `stack`; their URLs."""
    urls = []
    for _ in range(count):
        port = free_port()
        stack.enter_context(running([sys.executable, "-m", "bench.hop.fake_replica", "--port", str(port)], port))
        urls.append(f"http://127.0.0.1:{port}")
    return urls


def gateway_config(port: int, replicas: list[str], spec: str, workdir: Path) -> Path:
    """Our gateway on its shipped defaults with `<policy>[@workers][+idle]`; the config file's path."""
    policy, _, extras = spec.partition("+")
    policy, _, workers = policy.partition("@")
    pool: dict[str, object] = {
        "replicas": [{"url": url, "name": f"r{i}"} for i, url in enumerate(replicas)],
        "routing": {"policy": policy},
    }
    config: dict[str, object] = {
        "listen": {"host": "127.0.0.1", "port": port, "workers": int(workers or 1)},
        "pools": {MODEL: pool},
    }
    if extras == "idle":
        pool["prices"] = {"input": 1.0, "cached_input": 0.1, "output": 2.0}
        config["tracing"] = {"enabled": True, "endpoint": f"http://127.0.0.1:{free_port()}", "sampling_ratio": 0.0}
    elif extras:
        raise ValueError(f"unknown extras {extras!r} in ours:{spec} (known: idle)")
    path = workdir / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def wrk(
    url: str, threads: int, connections: int, stream: bool, seconds: float, tokens: int = 4
) -> tuple[int, int, float, float]:
    """One wrk run with `SCRIPT`, answers of `tokens` tokens: (completed requests, failed ones, seconds, p99 ms)."""
    command = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds:g}s", "--latency"]
    env = {**os.environ, "STREAM": "1" if stream else "0", "MODEL": MODEL, "MAX_TOKENS": str(tokens)}
    out = subprocess.run(
        [*command, "-s", str(SCRIPT), url], capture_output=True, text=True, env=env, timeout=seconds + 60
    )
    found = RESULT.search(out.stdout)
    if found is None:
        raise RuntimeError(f"wrk against {url} gave no result:\n{out.stdout}\n{out.stderr}")
    requests, errors, status = int(found[1]), int(found[2]), int(found[3])
    return requests, errors + status, float(found[4]), float(found[6])
