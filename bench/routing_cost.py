"""Routing decision cost per request: `Router.route` end to end (hash the prompt, one index lookup
for every candidate, the policy's choice, recording the pick) at 8k-token prompts and 64 replicas,
with the in-memory index and with the Redis index, both ways: lookups from the mirror (the default)
and `mirror: false` (one EVALSHA round trip per lookup).

The index is warmed first: `--conversations` conversations of `--turns` turns each are routed, so
every replica's table holds real chains and lookups walk real matches. Then `--requests` timed
routes, each a next turn of a random conversation (long matches on one replica, short elsewhere).
Also reports the index lookup alone (`match`, part of the route time), and index memory: Python
heap for the memory store (all gateways' and the test data), `MEMORY USAGE` for Redis.
`--gateways N` spreads the routes over N Routers sharing the Redis tables, so each one's local
table (the Redis lookup's hints) holds only its own writes, as in a multi-gateway deployment.

    .venv/bin/python -m bench.routing_cost --redis redis://127.0.0.1:6379/0 [--gateways 2] [--results NAME]

`--results NAME` also writes docs/benchmarks/results/NAME.json and NAME.md (bench/results.py), which the
routing cost page includes.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import tracemalloc
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from redis.asyncio import Redis

from bench import results
from gateway.config.features import IndexConfig, IndexStore
from gateway.config.pools import PrefixConfig
from gateway.index import WarmIndex, build_index
from gateway.log import setup_logging
from gateway.request.decision import Candidate
from gateway.routing.policies.registry import build_policy
from gateway.routing.router import Router
from gateway.view import RequestView
from lab.results import quantile
from lab.workloads import words


class TimedIndex:
    """The index, with `match` timed."""

    def __init__(self, index: WarmIndex) -> None:
        self.index = index
        self.times: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.index, name)

    async def match(self, hashes: Sequence[int], replica_ids: Iterable[str]) -> dict[str, int]:
        start = time.perf_counter()
        try:
            return await self.index.match(hashes, replica_ids)
        finally:
            self.times.append(time.perf_counter() - start)


def view(messages: list[dict[str, str]], n: int) -> RequestView:
    body = {"model": "m", "messages": messages, "max_tokens": 100, "stream": True}
    return RequestView(f"r{n}", "chat", "m", True, body, b"")


async def measure(store: str, mirror: bool, args: argparse.Namespace) -> dict[str, float]:
    rng = random.Random(0)
    prefix = f"bench-{uuid.uuid4().hex[:8]}:"
    gateways = 1 if store == "memory" else args.gateways
    params = IndexConfig(mirror=mirror, capacity_blocks=args.capacity_blocks)
    indexes = [
        TimedIndex(build_index(IndexStore(params, None if store == "memory" else store, prefix)))
        for _ in range(gateways)
    ]
    routers = [
        Router(build_policy(args.policy, {"seed": g}, "bench"), PrefixConfig(), index)
        for g, index in enumerate(indexes)
    ]
    replicas = [f"replica-{i}" for i in range(args.replicas)]
    # Sized by the gateway's own estimate (characters / 4), the number the Router and policy see.
    words_per_token = 1000 / (len(words(random.Random(1), 1000)) / PrefixConfig().chars_per_token)
    system = [{"role": "system", "content": words(rng, int(1000 * words_per_token))}]
    per_turn = int((args.prompt_tokens - 1000) / args.turns * words_per_token)
    convs = [system + [{"role": "user", "content": words(rng, per_turn)}] for _ in range(args.conversations)]
    n = 0
    tracemalloc.start()
    for _ in range(args.turns - 1):  # warm: every conversation grows to turns-1 turns
        for conv in convs:
            n += 1
            await routers[n % gateways].route(view(conv, n), [Candidate(r) for r in replicas])
            conv += [
                {"role": "assistant", "content": words(rng, 50)},
                {"role": "user", "content": words(rng, per_turn - 50)},
            ]
    for index in indexes:
        await index.flush()
        index.times.clear()
    heap_mb = tracemalloc.get_traced_memory()[0] / 2**20
    tracemalloc.stop()
    times, cpu_times, tokens = [], [], []
    for _ in range(args.requests):
        conv = rng.choice(convs)
        v = view(conv, n := n + 1)
        candidates = [Candidate(r, in_flight=rng.randrange(8)) for r in replicas]
        cpu_start, start = time.thread_time(), time.perf_counter()
        await routers[n % gateways].route(v, candidates)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.thread_time() - cpu_start)
        tokens.append(v.prompt_tokens_estimate)
        await asyncio.sleep(0)  # let the background Redis writer run, as it would between requests
    lookups = sorted(t for index in indexes for t in index.times)
    out = {
        "p50_ms": quantile(sorted(times), 0.5) * 1000,
        "p99_ms": quantile(sorted(times), 0.99) * 1000,
        "cpu_p50_ms": quantile(sorted(cpu_times), 0.5) * 1000,
        "cpu_p99_ms": quantile(sorted(cpu_times), 0.99) * 1000,
        "max_ms": max(times) * 1000,
        "lookup_p50_ms": quantile(lookups, 0.5) * 1000,
        "lookup_p99_ms": quantile(lookups, 0.99) * 1000,
        "prompt_tokens": sum(tokens) / len(tokens),
        "heap_mb": heap_mb,
    }
    if store != "memory":
        redis = Redis.from_url(store)  # default timeouts: the index's own clients fail fast by design
        keys = [f"{prefix}blocks:{r}" for r in replicas]
        out["redis_mb"] = sum([await redis.memory_usage(k) or 0 for k in keys]) / 2**20
        await redis.delete(*keys)
        await redis.aclose()
    for router in routers:
        await router.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=8000)
    parser.add_argument("--conversations", type=int, default=256)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument(
        "--capacity-blocks",
        type=int,
        default=IndexConfig().capacity_blocks,
        help="each replica's table size (smaller: tables at capacity, evicting as they record)",
    )
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--policy", default="prefix_affinity")
    parser.add_argument("--redis", help="also measure the Redis index at this URL (keys are removed afterwards)")
    parser.add_argument("--gateways", type=int, default=1, help="Routers sharing the Redis tables, taking turns")
    parser.add_argument("--results", metavar="NAME", help="also write docs/benchmarks/results/NAME.json and .md")
    args = parser.parse_args()
    setup_logging("warning")
    rows = []
    for store, mirror in [("memory", True)] + ([(args.redis, True), (args.redis, False)] if args.redis else []):
        name = "memory" if store == "memory" else "redis, mirror" if mirror else "redis, mirror: false"
        if store != "memory" and args.gateways > 1:
            name += f", ×{args.gateways} gateways"
        rows.append({"index": name, **asyncio.run(measure(store, mirror, args))})
        print(f"{name}: route p99 {rows[-1]['p99_ms']:.3f} ms", flush=True)
    figures = {"replicas": args.replicas, "requests": args.requests, "rows": rows}
    print("\n" + render(figures))
    if args.results:
        print(f"\nwrote {results.write(args.results, results.record('bench.routing_cost', figures), render)}")


def render(figures: dict[str, Any]) -> str:
    """One row per index (memory, Redis with its mirror, Redis with a round trip per lookup): the route's
    wall and CPU time, the lookup's share, and the memory the tables take."""
    lines = [
        f"{figures['requests']} timed routes per row, {figures['replicas']} replicas:",
        "",
        "| index | prompt tokens | route p50 ms | route p99 ms | max ms | CPU p50 ms | CPU p99 ms | lookup p50 ms "
        "| lookup p99 ms | gateway heap MB | Redis MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in figures["rows"]:
        lines.append(
            f"| {r['index']} | {r['prompt_tokens']:.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['max_ms']:.2f} | "
            f"{r['cpu_p50_ms']:.3f} | {r['cpu_p99_ms']:.3f} | "
            f"{r['lookup_p50_ms']:.3f} | {r['lookup_p99_ms']:.3f} | {r['heap_mb']:.1f} "
            f"| {r.get('redis_mb', 0):.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
