"""What the gateway adds: latency (p50/p99) and requests per second, direct vs through the gateway.

    python -m bench.gateway_overhead [--requests 1000] [--concurrency 32] [--speedup 1000]

Starts one replica stub (simulated engine, very fast) and one gateway in front of it, both as
child processes on loopback, then in one run:
  1. low load: N sequential requests, alternating direct / via gateway (so drift hits both),
     non-streaming (max_tokens 1) and streaming (max_tokens 4, time to the last byte);
  2. throughput: the same requests at a fixed concurrency, direct vs via gateway.
The gateway runs its shipped defaults (request log on, load scrape every 0.5 s, probes every 2 s).
Client, gateway and replica share the machine's cores, so rps is a lower bound for the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
import yaml

from gateway.cluster import free_port

MODEL = "bench-model"


@contextmanager
def _process(args: list[str], port: int) -> Iterator[None]:
    """Run a child process until the block ends; ready once its port accepts connections."""
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"{args} exited:\n{log.read().decode(errors='replace')[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), 0.2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        proc.wait(10)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _one(session: aiohttp.ClientSession, url: str, stream: bool) -> float:
    body = {"model": MODEL, "prompt": "benchmark", "max_tokens": 4 if stream else 1, "stream": stream}
    started = time.perf_counter()
    async with session.post(url + "/v1/completions", json=body) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: status {resp.status}")
    return time.perf_counter() - started


async def _latency(direct: str, gateway: str, n: int, stream: bool) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"direct": [], "gateway": []}
    async with aiohttp.ClientSession() as session:
        for _ in range(20):  # warm up connections and code paths
            await _one(session, direct, stream)
            await _one(session, gateway, stream)
        for _ in range(n):
            samples["direct"].append(await _one(session, direct, stream))
            samples["gateway"].append(await _one(session, gateway, stream))
    return samples


async def _throughput(url: str, n: int, concurrency: int, stream: bool) -> float:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(_one(session, url, stream) for _ in range(concurrency)))
        remaining = n

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await _one(session, url, stream)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return n / (time.perf_counter() - started)


async def _run(direct: str, gateway: str, args: argparse.Namespace) -> list[str]:
    rows = ["| mode | direct p50 ms | gateway p50 ms | added p50 ms | direct p99 ms | gateway p99 ms | added p99 ms "
            f"| direct rps (c={args.concurrency}) | gateway rps | rps ratio |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for stream in (False, True):
        s = await _latency(direct, gateway, args.requests, stream)
        d50, g50 = statistics.median(s["direct"]) * 1e3, statistics.median(s["gateway"]) * 1e3
        d99, g99 = _percentile(s["direct"], 0.99) * 1e3, _percentile(s["gateway"], 0.99) * 1e3
        rps_direct = await _throughput(direct, args.requests, args.concurrency, stream)
        rps_gateway = await _throughput(gateway, args.requests, args.concurrency, stream)
        rows.append(f"| {'streaming' if stream else 'non-streaming'} | {d50:.2f} | {g50:.2f} | {g50 - d50:.2f} "
                    f"| {d99:.2f} | {g99:.2f} | {g99 - d99:.2f} | {rps_direct:.0f} | {rps_gateway:.0f} "
                    f"| {rps_gateway / rps_direct:.2f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests per measurement")
    parser.add_argument("--concurrency", type=int, default=32, help="in-flight requests in the throughput phase")
    parser.add_argument("--speedup", type=float, default=1000.0, help="replica stub speed factor")
    args = parser.parse_args(argv)

    replica_port, gateway_port = free_port(), free_port()
    direct, gateway = f"http://127.0.0.1:{replica_port}", f"http://127.0.0.1:{gateway_port}"
    config = {"listen": {"host": "127.0.0.1", "port": gateway_port},
              "pools": {MODEL: {"replicas": [{"url": direct, "name": "r0"}]}}}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as config_file:
        yaml.safe_dump(config, config_file)
        config_file.flush()
        stub = [sys.executable, "-m", "replica_stub", "--port", str(replica_port), "--model", MODEL,
                "--engine", "sim", "--speedup", str(args.speedup), "--log-level", "warning"]
        serve = [sys.executable, "-m", "gateway", "serve", "--config", config_file.name]
        with _process(stub, replica_port), _process(serve, gateway_port):
            rows = asyncio.run(_run(direct, gateway, args))
    print(f"# gateway overhead: {args.requests} requests per cell, replica stub speedup {args.speedup}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.machine()}")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
