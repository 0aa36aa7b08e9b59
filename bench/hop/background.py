"""What `serve --workers N` costs the replicas in background traffic: health probes, load scrapes and
model lists per replica per second, idle, with 1, 2 and 4 workers.

    python -m bench.hop.background [--seconds 10] [--workers 1,2,4]

Each worker is a whole gateway with its own monitor (`gateway.replicas.health`), so this traffic is
expected to grow with N; the table says by how much, from the replicas' own counts
(`bench.hop.fake_replica`'s `/bench/counts`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import httpx

from bench.hop.processes import running
from bench.hop.rig import fake_replicas, gateway_config
from lab.cluster import free_port

PATHS = ("/health", "/metrics", "/v1/models")


def counts(replicas: list[str]) -> Counter[str]:
    total: Counter[str] = Counter()
    for url in replicas:
        total.update(httpx.get(f"{url}/bench/counts", timeout=5).json())
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hop.background", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", default="1,2,4")
    args = parser.parse_args(argv)
    rows = ["| workers | " + " | ".join(f"{p} per replica per s" for p in PATHS) + " |", "|---|---|---|---|"]
    for workers in [int(w) for w in args.workers.split(",")]:
        with tempfile.TemporaryDirectory() as workdir, ExitStack() as stack:
            replicas = fake_replicas(stack)
            port = free_port()
            config = gateway_config(port, replicas, f"prefix_affinity@{workers}", Path(workdir))
            stack.enter_context(running([sys.executable, "-m", "gateway", "serve", "--config", str(config)], port))
            time.sleep(3)  # every worker up and past its first probes
            before = counts(replicas)
            time.sleep(args.seconds)
            after = counts(replicas)
        rate = {p: (after[p] - before[p]) / args.seconds / len(replicas) for p in PATHS}
        rows.append(f"| {workers} | " + " | ".join(f"{rate[p]:.2f}" for p in PATHS) + " |")
    print(f"# background traffic, idle, {args.seconds:g} s per row, 3 replicas, shipped defaults")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
