"""The stress cells against the oracle: bursts, RAG chunks, long answers and the fingerprint cells, in the
simulator, with prefix_affinity's TTFT p90 with and without the price of a burst in flight (`burst_weight`),
the engine-aware oracle's and round robin's.

    .venv/bin/python -m bench.stress_matrix --out bench-results/stress [--results stress]
    .venv/bin/python -m bench.stress_matrix --seeds 0,1,2 --out bench-results/stress-seeds [--results stress-seeds]

Per cell, two `affinity-gateway simulate` runs: prefix_affinity, oracle and round_robin with their
defaults, and prefix_affinity with `burst_weight=0`. With `--seeds`, only the cells that move (`MOVED`):
prefix_affinity with and without the price per seed, the medians, and the oracle's median. The simulator is
deterministic, so a rerun on any machine prints the same figures; `--results NAME` publishes them
(docs/benchmarks/results/NAME.json and .md, bench/results.py).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from statistics import median
from typing import Any

from bench import results
from bench.quiet_run import run_quietly
from bench.simulator_fingerprint import CELLS as FINGERPRINT

PRESSURE = "-p tenants=32 -p system_tokens=3000"
# cell -> its simulate arguments (with --seed; `--seeds` replaces it)
CELLS = {
    "tenant-bursts, moderate": "-w tenant-bursts --rate 6 --replicas 4 --seed 0",
    "tenant-bursts, high": "-w tenant-bursts --rate 10 --replicas 4 --seed 0",
    "rag-chunks, moderate": "-w rag-chunks --rate 12 --replicas 4 --seed 0",
    "rag-chunks, high": "-w rag-chunks --rate 18 --replicas 4 --seed 0",
    "decode-heavy, moderate": "-w decode-heavy --rate 3 --replicas 4 --seed 0",
    "decode-heavy, high": "-w decode-heavy --rate 6 --replicas 4 --seed 0",
    # Bursts under cache pressure: 32 tenants' 3,000-token prompts do not all fit every replica's cache, so
    # a tenant's burst lands where its prompt is warm, in a batch of long contexts that slows every step.
    "tenant-bursts-pressure, moderate": f"-w tenant-bursts {PRESSURE} --rate 4.5 --replicas 4 --seed 0",
    "tenant-bursts-pressure, high": f"-w tenant-bursts {PRESSURE} --rate 6 --replicas 4 --seed 0",
    **{f"{name} (fingerprint)": cell for name, cell in FINGERPRINT.items()},
}
# the cells that move with the burst price or from seed to seed, for the table over seeds
MOVED: tuple[str, ...] = ("tenant-bursts, moderate", "tenant-bursts, high", "rag-chunks, high")
MOVED += ("tenant-bursts-pressure, high", "prefix-groups (fingerprint)", "hot-tenant (fingerprint)")
OFF = "-P prefix_affinity.burst_weight=0"
NO_PRICE = "prefix_affinity, burst_weight=0"


def simulate(arguments: str, out: Path) -> dict[str, dict[str, Any]]:
    """One simulate run: per policy, its TTFT p90 and that of later turns (None without sessions). A run
    with `--evidence events` names its policies `<policy>+events`; the table names the policy."""
    runs = run_quietly(shlex.split(f"simulate {arguments} --speedup 10 --no-plots -q"), out, stderr=True)["runs"]
    return {
        name.partition("+")[0]: {k: run.get(k) for k in ("ttft_p90_s", "later_ttft_p90_s")}
        for name, run in runs.items()
    }


def with_seed(arguments: str, seed: int) -> str:
    words = shlex.split(arguments)
    words[words.index("--seed") + 1] = str(seed)
    return shlex.join(words)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", help="cell names separated by ; (default: all; with --seeds, those it moves)")
    parser.add_argument("--seeds", help="e.g. 0,1,2: prefix_affinity alone on the cells the price moves")
    parser.add_argument("--out", type=Path, default=Path("bench-results/stress"))
    parser.add_argument("--results", metavar="NAME", help="also write docs/benchmarks/results/NAME.json and .md")
    args = parser.parse_args()
    chosen = args.cells.split(";") if args.cells else list(MOVED if args.seeds else CELLS)
    figures: dict[str, Any]
    if args.seeds:
        seeds = [int(s) for s in args.seeds.split(",")]
        rows = []
        for cell in chosen:
            by_seed = {}
            for seed in seeds:
                cmd, out = with_seed(CELLS[cell], seed), args.out / f"{cell}-{seed}".replace(", ", "-").replace(" ", "")
                off = simulate(f"{cmd} --policies prefix_affinity {OFF}", out / "off")["prefix_affinity"]
                on = simulate(f"{cmd} --policies prefix_affinity,oracle", out / "on")
                ours, oracle = on["prefix_affinity"]["ttft_p90_s"], on["oracle"]["ttft_p90_s"]
                by_seed[str(seed)] = [off["ttft_p90_s"], ours, oracle]
            rows.append({"cell": cell, "seeds": by_seed})
        figures = {"seeds": seeds, "rows": rows}
    else:
        rows = []
        for cell in chosen:
            out = args.out / cell.replace(", ", "-").replace(" ", "")
            runs = simulate(f"{CELLS[cell]} --policies prefix_affinity,oracle,round_robin", out / "default")
            runs[NO_PRICE] = simulate(f"{CELLS[cell]} --policies prefix_affinity {OFF}", out / "off")["prefix_affinity"]
            rows.append({"cell": cell, "arguments": CELLS[cell], "runs": runs})
        figures = {"rows": rows}
    print(render(figures))
    if args.results:
        print(f"\nwrote {results.write(args.results, results.record('bench.stress_matrix', figures), render)}")


def _ms(run: dict[str, Any]) -> str:
    """TTFT p90 in ms, and in brackets the later turns' where the workload has sessions."""
    later = run.get("later_ttft_p90_s")
    return f"{run['ttft_p90_s'] * 1000:.0f}" + ("" if later is None else f" ({later * 1000:.0f})")


def render(figures: dict[str, Any]) -> str:
    """The cells table (TTFT p90 ms per policy, later turns in brackets, default ÷ oracle), or with seeds
    prefix_affinity's p90 without → with the price per seed and the medians."""
    if "seeds" in figures:
        seeds = figures["seeds"]
        lines = [
            "| cell | " + " | ".join(f"seed {s}" for s in seeds) + " | median | oracle's median | default ÷ oracle |",
            "|---|" + "---|" * (len(seeds) + 3),
        ]
        for row in figures["rows"]:
            runs = [row["seeds"][str(s)] for s in seeds]
            cells = [f"{off * 1000:.0f} → {on * 1000:.0f}" for off, on, _ in runs]
            off, on, oracle = (median(run[i] for run in runs) for i in range(3))
            lines.append(
                f"| {row['cell']} | " + " | ".join(cells) + f" | {off * 1000:.0f} → {on * 1000:.0f} | "
                f"{oracle * 1000:.0f} | {on / oracle:.2f} |"
            )
        return "\n".join(lines)
    lines = [
        "| cell | command (`affinity-gateway simulate ... --speedup 10`) | prefix_affinity, `burst_weight=0` "
        "| default | oracle | round_robin | default ÷ oracle |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in figures["rows"]:
        runs = row["runs"]
        ratio = runs["prefix_affinity"]["ttft_p90_s"] / runs["oracle"]["ttft_p90_s"]
        lines.append(
            f"| {row['cell']} | `{row['arguments']}` | {_ms(runs[NO_PRICE])} | {_ms(runs['prefix_affinity'])} | "
            f"{_ms(runs['oracle'])} | {_ms(runs['round_robin'])} | {ratio:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
