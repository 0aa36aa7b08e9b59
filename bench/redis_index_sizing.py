"""Redis sizing for the shared warm-prefix index: bytes per cached block and commands per request.

    python -m bench.redis_index_sizing [--replicas 8] [--blocks 100000] [--requests 2000]

Starts a private redis-server on a free loopback port and drives it through the gateway's own
`RedisIndex`, so the numbers are those of the real key layout and Lua scripts:
  1. fill: each replica's table gets `--blocks` block hashes (chains of 64, as requests record
     them); `INFO memory` used_memory before and after gives bytes per block;
  2. traffic: `--requests` requests, each one lookup over every replica and one record of a
     64-block chain that shares its first half with an earlier request; `INFO commandstats`
     deltas give Redis commands per request (script calls and the commands the scripts run).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import subprocess
import time

import redis

from gateway.config.features import IndexConfig, IndexStore
from gateway.index.redis_store import RedisIndex
from lab.cluster import free_port

CHAIN = 64  # blocks per request: a 4,096-character (~1,000-token) prompt at the default block size


def _stats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """command -> (calls, microseconds inside Redis)."""
    info = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for name, v in info.items()}


async def run(replicas: int, blocks: int, requests: int, port: int) -> None:
    client = redis.Redis(port=port)
    index = RedisIndex(
        IndexStore(IndexConfig(capacity_blocks=blocks * 2, timeout_s=1.0), f"redis://127.0.0.1:{port}/0")
    )
    rng = random.Random(7)
    before = int(client.info("memory")["used_memory"])
    for r in range(replicas):
        for _ in range(blocks // CHAIN):
            index.record(f"replica-{r}", [rng.getrandbits(64) for _ in range(CHAIN)])
        await index.flush()
    after = int(client.info("memory")["used_memory"])
    total = replicas * (blocks // CHAIN) * CHAIN
    print(
        f"fill: {replicas} tables x {blocks // CHAIN * CHAIN} blocks = {total} blocks, "
        f"used_memory {before} -> {after} B: {(after - before) / total:.1f} B per block, "
        f"{client.dbsize()} keys, redis-server {client.info('server')['redis_version']}"
    )

    ids = [f"replica-{r}" for r in range(replicas)]
    prefixes = [[rng.getrandbits(64) for _ in range(CHAIN // 2)] for _ in range(50)]
    start_stats, started = _stats(client), time.perf_counter()
    lookup_s = []
    for i in range(requests):
        chain = prefixes[i % len(prefixes)] + [rng.getrandbits(64) for _ in range(CHAIN // 2)]
        t = time.perf_counter()
        await index.match(chain, ids)
        lookup_s.append(time.perf_counter() - t)
        index.record(ids[i % replicas], chain)
    await index.flush()
    elapsed = time.perf_counter() - started
    end_stats = _stats(client)
    delta = {
        k: (calls - start_stats.get(k, (0, 0))[0], usec - start_stats.get(k, (0, 0))[1])
        for k, (calls, usec) in end_stats.items()
        if k not in ("info", "hello")
    }
    per_request = ", ".join(f"{name} {calls / requests:.2f}" for name, (calls, _) in sorted(delta.items()) if calls)
    busy_us = sum(usec for name, (_, usec) in delta.items() if name.startswith(("evalsha", "script")))
    lookup_s.sort()
    print(
        f"traffic: {requests} requests ({replicas} candidates, {CHAIN}-block chains) in {elapsed:.2f} s; "
        f"per request: {per_request}; Redis busy {busy_us / requests:.1f} µs per request (commandstats usec)"
    )
    print(
        f"lookup round trip p50 {lookup_s[len(lookup_s) // 2] * 1e3:.3f} ms, "
        f"p99 {lookup_s[int(len(lookup_s) * 0.99)] * 1e3:.3f} ms (client, Lua and loopback included)"
    )
    await index.close()
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=100_000, help="blocks per replica table")
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found")
    port = free_port()
    server = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--loglevel",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        asyncio.run(run(args.replicas, args.blocks, args.requests, port))
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
