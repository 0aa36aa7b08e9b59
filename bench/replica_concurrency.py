"""Benchmark: one simulated replica holding N concurrent SSE streams without its event loop lagging.

Starts `replica-stub` (sim engine) as a subprocess, opens N streaming chat completions at
once with aiohttp, reads every chunk, and reports the replica's own event-loop lag probe
(`replica_stub_event_loop_lag_*` in /metrics: how late a 10 ms sleeper wakes up) together
with peak running requests, tokens per second, client-side TTFT and the replica's CPU use
(cores busy on average: above ~0.8 the replica itself is the bottleneck). Lag is split into the
ramp (all N connections and requests arriving at once) and the steady phase (all N running);
"le" figures are histogram bucket bounds: the true value is at most that. `--runs N` repeats the
run against a fresh replica each time (the lag's worst samples vary from run to run).

    python -m bench.replica_concurrency --streams 1000 --speedup 100 --max-tokens 200 [--runs 3] [--results NAME]

`--results NAME` also writes docs/benchmarks/results/NAME.json and NAME.md (bench/results.py), which the
replica stub page includes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench import results
from lab.cluster import free_port

ROOT = Path(__file__).resolve().parent.parent
LAG = "replica_stub_event_loop_lag_seconds"


def parse_metrics(text: str) -> dict[str, float]:
    """name{labels} -> value, labels kept verbatim (enough for the few series read here)."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    return values


def series(metrics: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k == prefix or k.startswith(prefix + "{"))


def lag_buckets(before: dict[str, float], after: dict[str, float]) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of the lag probe's samples taken between two scrapes."""
    return sorted(
        (float(k.split('le="')[1].split('"')[0]), after[k] - before.get(k, 0.0))
        for k in after
        if k.startswith(f"{LAG}_bucket")
    )


def lag_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Upper bucket bound holding quantile q (q=1: the bound of the worst sample)."""
    total = buckets[-1][1]
    return next((bound for bound, count in buckets if count >= q * total), float("inf"))


async def one_stream(
    session: aiohttp.ClientSession, url: str, i: int, max_tokens: int, delay_s: float = 0.0
) -> tuple[float, int]:
    await asyncio.sleep(delay_s)
    body = {
        "model": "stub-model",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "messages": [{"role": "user", "content": f"stream {i}: tell me a long story about the sea"}],
    }
    start, ttft, chunks = time.perf_counter(), 0.0, 0
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.content:
            if line.startswith(b"data: {"):
                chunk = orjson.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    chunks += 1
                    ttft = ttft or time.perf_counter() - start
    return ttft, chunks


async def run(args: argparse.Namespace, url: str) -> dict[str, float]:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:

        async def scrape() -> dict[str, float]:
            async with session.get(f"{url}/metrics") as response:
                return parse_metrics(await response.text())

        before = await scrape()
        start = time.perf_counter()
        tasks = [
            asyncio.create_task(one_stream(session, url, i, args.max_tokens, args.ramp_s * i / args.streams))
            for i in range(args.streams)
        ]
        peak_running, all_running = 0.0, before
        while not all(t.done() for t in tasks):
            now = await scrape()
            running = series(now, "vllm:num_requests_running")
            if running > peak_running:
                peak_running, all_running = running, now
            await asyncio.sleep(0.25)
        elapsed = time.perf_counter() - start
        results = [t.result() for t in tasks]
        after = await scrape()
    ttfts = sorted(r[0] for r in results)
    tokens = sum(r[1] for r in results)
    ramp, steady = lag_buckets(before, all_running), lag_buckets(all_running, after)
    return {
        "streams": args.streams,
        "completed": sum(1 for r in results if r[1] == args.max_tokens),
        "peak_running": peak_running,
        "elapsed_s": elapsed,
        "tokens_per_s": tokens / elapsed,
        "ttft_p50_s": ttfts[len(ttfts) // 2],
        "ttft_p99_s": ttfts[int(len(ttfts) * 0.99) - 1],
        "ramp_lag_max_le_s": lag_quantile(ramp, 1.0),
        "steady_lag_p99_le_s": lag_quantile(steady, 0.99),
        "steady_lag_max_le_s": lag_quantile(steady, 1.0),
        "steady_probe_samples": steady[-1][1],
        "replica_cpu_util": (after["process_cpu_seconds_total"] - before["process_cpu_seconds_total"]) / elapsed,
        "lag_max_s": after["replica_stub_event_loop_lag_max_seconds"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--speedup", type=float, default=100)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--ramp-s", type=float, default=0.0, help="spread the stream starts over this time")
    parser.add_argument("--max-num-seqs", type=int, default=1024)
    parser.add_argument("--num-gpu-blocks", type=int, default=16384, help="KV capacity; the default holds all streams")
    parser.add_argument("--runs", type=int, default=1, help="repeat against a fresh replica each time")
    parser.add_argument("--results", metavar="NAME", help="also write docs/benchmarks/results/NAME.json and .md")
    args = parser.parse_args()
    runs = [one_run(args) for _ in range(args.runs)]
    figures = {"streams": args.streams, "speedup": args.speedup, "max_tokens": args.max_tokens, "runs": runs}
    print(render(figures))
    if args.results:
        published = results.record("bench.replica_concurrency", figures)
        print(f"\nwrote {results.write(args.results, published, render)}")
    return 0 if all(run["completed"] == args.streams for run in runs) else 1


def one_run(args: argparse.Namespace) -> dict[str, float]:
    """One replica stub started for this run alone, so no run inherits another's heap or histograms."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "replica_stub",
        "--port",
        str(port),
        "--engine",
        "sim",
        "--speedup",
        str(args.speedup),
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--num-gpu-blocks",
        str(args.num_gpu_blocks),
        "--log-level",
        "warning",
    ]
    replica = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(wait_ready(url))
        result = asyncio.run(run(args, url))
    finally:
        replica.terminate()
        replica.wait(10)
    return result


def render(figures: dict[str, Any]) -> str:
    """One row per run: whether every stream completed and ran at once, then the loop lag ("≤": a
    histogram bucket's bound, the true value is at most that), the replica's CPU and throughput."""
    streams = figures["streams"]
    rows = [
        f"{streams} streams of {figures['max_tokens']} tokens, sim replica at speedup {figures['speedup']:g}:",
        "",
        "| run | completed | peak running | steady lag p99 | steady lag max | ramp lag max | max lag (gauge) | "
        "replica CPU (cores) | tokens/s | TTFT p50 / p99 s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for number, run in enumerate(figures["runs"], 1):
        rows.append(
            f"| {number} | {run['completed']}/{streams} | {run['peak_running']:.0f} | "
            f"{_bound(run['steady_lag_p99_le_s'])} | {_bound(run['steady_lag_max_le_s'])} | "
            f"{_bound(run['ramp_lag_max_le_s'])} | {run['lag_max_s'] * 1000:.1f} ms | {run['replica_cpu_util']:.2f} | "
            f"{run['tokens_per_s']:,.0f} | {run['ttft_p50_s']:.2f} / {run['ttft_p99_s']:.2f} |"
        )
    return "\n".join(rows)


def _bound(seconds: float | None) -> str:
    """A bucket bound as the page writes it. Past the last finite bucket the lag has no upper bound
    (infinity, which the JSON keeps as null)."""
    return "> largest bucket" if seconds is None or seconds == float("inf") else f"≤ {seconds * 1000:.0f} ms"


async def wait_ready(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"{url}/health") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.1)


if __name__ == "__main__":
    raise SystemExit(main())
