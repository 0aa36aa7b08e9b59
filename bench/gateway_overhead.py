"""What a router adds: latency (p50/p99), requests per second and CPU per request, direct vs through
our gateway and through the other routers, in one run.

    python -m bench.gateway_overhead [--requests 1000] [--concurrency 64] [--speedup 1000]
                                     [--routers affinity-gateway,affinity-gateway:prefix_affinity,
                                                affinity-gateway@2,sglang,smg,nginx]
                                     # affinity-gateway@2: `serve --workers 2` (any policy: …:prefix_affinity@2)

Starts one replica stub (simulated engine, very fast) and each router in front of it, all as child
processes on loopback, then in one run:
  1. low load: N sequential requests per target, in rounds over every target (so drift hits all),
     non-streaming (max_tokens 1) and streaming (max_tokens 4, time to the last byte);
  2. throughput: the same requests at a fixed concurrency, one target at a time, with the CPU
     time the router's processes spent (user + system, from /proc) divided by the requests.
Our gateway runs its shipped defaults (request log on, load scrape every 0.5 s, probes every 2 s)
with the policy named after the colon (round_robin when none), and as many worker processes as
named after an `@` (one when none; its CPU then counts the supervisor and every worker).
sglang-router and SMG come from `make peers` (round_robin), nginx from the system
(`proxy_buffering off`, upstream keep-alive). A
router named but not installed is printed as such, never left out. As root the whole run moves
into a loopback-only network namespace (the peers stay offline). Client, replica and routers share
the machine's cores, so requests per second are lower bounds; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import aiohttp
import yaml

from lab import peers
from lab.cluster import free_port

MODEL = "bench-model"
ROUTERS = "affinity-gateway,affinity-gateway:prefix_affinity,affinity-gateway@2,sglang,smg,nginx"
NGINX_CONF = """daemon off; worker_processes 1; pid {dir}/nginx.pid; error_log {dir}/error.log error;
events {{ worker_connections 4096; }}
http {{ access_log off; upstream replica {{ server 127.0.0.1:{replica}; keepalive 64; }}
  server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://replica; proxy_http_version 1.1;
    proxy_set_header Connection ""; proxy_buffering off; }} }} }}
"""


@contextmanager
def _process(args: list[str], port: int, env: dict[str, str] | None = None) -> Iterator[int]:
    """Run a child process until the block ends; ready once its port accepts connections. Yields its pid."""
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        args, stdout=log, stderr=subprocess.STDOUT, env={**(env or os.environ), "PYTHONUNBUFFERED": "1"}
    )
    try:
        deadline = time.monotonic() + 60
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
        yield proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` and its live descendants (nginx's workers), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}  # pid -> (parent, cpu seconds)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    tree, total, grew = {pid}, 0.0, True
    while grew:
        grew = False
        for child, (parent, _) in stats.items():
            if parent in tree and child not in tree:
                tree.add(child)
                grew = True
    for member in tree:
        total += stats.get(member, (0, 0.0))[1]
    return total


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


async def _latency(targets: dict[str, str], n: int, stream: bool) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in targets}
    async with aiohttp.ClientSession() as session:
        for _ in range(20):  # warm up connections and code paths
            for url in targets.values():
                await _one(session, url, stream)
        for _ in range(n):
            for name, url in targets.items():
                samples[name].append(await _one(session, url, stream))
    return samples


async def _throughput(url: str, n: int, concurrency: int, stream: bool, pid: int | None) -> tuple[float, float]:
    """Requests per second at `concurrency`, and CPU ms per request of `pid`'s processes (nan: no pid)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(_one(session, url, stream) for _ in range(concurrency)))
        remaining = n

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await _one(session, url, stream)

        cpu_before = cpu_seconds(pid) if pid else 0.0
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        cpu_ms = (cpu_seconds(pid) - cpu_before) * 1e3 / n if pid else float("nan")
        return n / elapsed, cpu_ms


async def _run(targets: dict[str, str], pids: dict[str, int], args: argparse.Namespace) -> list[str]:
    rows = [
        f"| mode | target | p50 ms | added p50 ms | p99 ms | added p99 ms | rps (c={args.concurrency}) "
        "| rps / direct | rps / ours | CPU ms per request |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for stream in (False, True):
        samples = await _latency(targets, args.requests, stream)
        rps = {
            name: await _throughput(url, args.requests, args.concurrency, stream, pids.get(name))
            for name, url in targets.items()
        }
        d50, d99 = statistics.median(samples["direct"]) * 1e3, _percentile(samples["direct"], 0.99) * 1e3
        ours = rps["affinity-gateway"][0]
        for name in targets:
            p50, p99 = statistics.median(samples[name]) * 1e3, _percentile(samples[name], 0.99) * 1e3
            rate, cpu_ms = rps[name]
            cpu = "-" if name == "direct" else f"{cpu_ms:.3f}"
            rows.append(
                f"| {'streaming' if stream else 'non-streaming'} | {name} | {p50:.2f} | {p50 - d50:.2f} "
                f"| {p99:.2f} | {p99 - d99:.2f} | {rate:.0f} | {rate / rps['direct'][0]:.2f} "
                f"| {rate / ours:.2f} | {cpu} |"
            )
    return rows


def _start(stack: ExitStack, router: str, replica: str, replica_port: int, workdir: Path) -> tuple[str, int] | str:
    """Start one router in front of the replica: (its URL, its pid), or why it cannot run here."""
    port = free_port()
    spec, _, workers = router.partition("@")
    name, _, policy = spec.partition(":")
    if workers and (name != "affinity-gateway" or not workers.isdigit() or int(workers) < 1):
        return f"@{workers}: only affinity-gateway[:policy]@N, N >= 1, has worker processes"
    if name == "affinity-gateway":
        config = {
            "listen": {"host": "127.0.0.1", "port": port, "workers": int(workers or 1)},
            "pools": {
                MODEL: {"replicas": [{"url": replica, "name": "r0"}], "routing": {"policy": policy or "round_robin"}}
            },
        }
        path = workdir / f"gateway-{port}.yaml"
        path.write_text(yaml.safe_dump(config))
        pid = stack.enter_context(_process([sys.executable, "-m", "gateway", "serve", "--config", str(path)], port))
    elif name == "nginx":
        binary = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
        if binary is None:
            return "not installed (apt-get install nginx)"
        conf = workdir / f"nginx-{port}.conf"
        conf.write_text(NGINX_CONF.format(dir=workdir, replica=replica_port, port=port))
        pid = stack.enter_context(_process([binary, "-c", str(conf), "-p", str(workdir)], port))
    else:
        try:
            contestant = peers.contestant(f"{name}:{policy or 'round_robin'}")
        except ValueError as exc:
            return str(exc)
        assert contestant.peer is not None
        command = contestant.peer.command(contestant.policy, port, [replica], free_port())
        pid = stack.enter_context(_process(command, port, env=peers.peer_env()))
    return f"http://127.0.0.1:{port}", pid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests per measurement")
    parser.add_argument("--concurrency", type=int, default=64, help="in-flight requests in the throughput phase")
    parser.add_argument("--speedup", type=float, default=1000.0, help="replica stub speed factor")
    parser.add_argument("--routers", default=ROUTERS, help=f"comma-separated (default {ROUTERS})")
    args = parser.parse_args(argv)
    routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    wants_peer = any(r.partition(":")[0] in peers.PEERS for r in routers)
    if wants_peer and os.geteuid() == 0 and shutil.which("ip") and not peers.isolated():
        return peers.rerun_isolated(sys.argv[1:] if argv is None else argv, module="bench.gateway_overhead")

    replica_port = free_port()
    replica = f"http://127.0.0.1:{replica_port}"
    stub = [
        sys.executable,
        "-m",
        "replica_stub",
        "--port",
        str(replica_port),
        "--model",
        MODEL,
        "--engine",
        "sim",
        "--speedup",
        str(args.speedup),
        "--log-level",
        "warning",
    ]
    missing: list[str] = []
    with tempfile.TemporaryDirectory() as workdir, ExitStack() as stack:
        stack.enter_context(_process(stub, replica_port))
        targets, pids = {"direct": replica}, {}
        for router in routers:
            started = _start(stack, router, replica, replica_port, Path(workdir))
            if isinstance(started, str):
                missing.append(f"- {router}: {started}")
                continue
            targets[router], pids[router] = started
        if "affinity-gateway" not in targets:
            parser.error("--routers must include affinity-gateway (the ratios are to it)")
        rows = asyncio.run(_run(targets, pids, args))
    print(
        f"# router overhead: {args.requests} requests per cell, replica stub speedup {args.speedup}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.machine()}"
    )
    print("\n".join(rows))
    if missing:
        print("\nNot measured:\n" + "\n".join(missing))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
