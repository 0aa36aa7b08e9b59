"""One `affinity-gateway simulate` cell over several seeds: each policy's TTFT p50 / p90 / p99 per seed
and their means. A cell where policies are level (hot-prefix at saturation) is only told apart, or
shown level, over seeds; one seed's difference is the seed's.

    .venv/bin/python -m bench.seeds --seeds 0-9 --out bench-results/hot [--results NAME] \\
        -w hot-prefix -p requests=2000 --rate 32 --replicas 8 --policies least_loaded,prefix_affinity

Every argument this command does not know is passed to `simulate` (with `--seed` per run). The
simulator is deterministic, so a rerun on any machine prints the same figures; `--results NAME`
publishes them (docs/benchmarks/results/NAME.json and .md, bench/results.py).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from statistics import fmean
from typing import Any

from bench import results
from bench.quiet_run import run_quietly

QUANTILES = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s")


def seed_list(value: str) -> list[int]:
    """`0-9` or `0,3,7`."""
    if "-" in value:
        first, last = value.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(seed) for seed in value.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--seeds", type=seed_list, default=seed_list("0-9"), help="e.g. 0-9 or 0,3,7")
    parser.add_argument("--out", type=Path, default=Path("bench-results/seeds"))
    parser.add_argument("--results", metavar="NAME", help="also write docs/benchmarks/results/NAME.json and .md")
    args, cell = parser.parse_known_args()
    if "--seed" in cell or "--out" in cell:
        parser.error("--seed and --out are this command's (per seed), not simulate's")
    by_seed: dict[str, dict[str, list[float]]] = {}
    for seed in args.seeds:
        out = args.out / f"seed-{seed}"
        command = [*cell, "--seed", str(seed), "--no-plots", "-q"]
        print(f"affinity-gateway simulate {shlex.join([*command, '--out', str(out)])}", flush=True)
        runs = run_quietly(["simulate", *command], out)["runs"]
        by_seed[str(seed)] = {policy: [run[q] for q in QUANTILES] for policy, run in runs.items()}
    figures = {"simulate": shlex.join(cell), "seeds": by_seed}
    print("\n" + render(figures))
    if args.results:
        print(f"\nwrote {results.write(args.results, results.record('bench.seeds', figures), render)}")


def render(figures: dict[str, Any]) -> str:
    """TTFT p50 / p90 / p99 in seconds, a row per seed and the mean of each over the seeds in bold."""
    by_seed: dict[str, dict[str, list[float]]] = figures["seeds"]
    policies = list(next(iter(by_seed.values())))
    rows = [
        "TTFT p50 / p90 / p99 in seconds per seed:",
        "",
        "| seed | " + " | ".join(f"`{policy}`" for policy in policies) + " |",
        "|---|" + "---|" * len(policies),
    ]
    for seed, runs in by_seed.items():
        rows.append(f"| {seed} | " + " | ".join(_cell(runs[policy]) for policy in policies) + " |")
    means = [[fmean(runs[p][i] for runs in by_seed.values()) for i in range(len(QUANTILES))] for p in policies]
    rows.append("| **mean** | " + " | ".join(f"**{_cell(mean)}**" for mean in means) + " |")
    return "\n".join(rows)


def _cell(quantiles: list[float]) -> str:
    return " / ".join(f"{q:.2f}" for q in quantiles)


if __name__ == "__main__":
    main()
