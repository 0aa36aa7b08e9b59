"""The published policy comparison: every workload at light, medium and saturating load, six policies
(plus prefix_affinity with `preamble_weight=1`), in the simulator. Prints one Markdown table per cell
and the exact `affinity-gateway simulate` command behind it; results land in `--out`/<cell>/.

    .venv/bin/python -m bench.policy_matrix --replicas 8 --out bench-results/matrix-8
    .venv/bin/python -m bench.policy_matrix --replicas 64 --scale 8 --loads saturating --out bench-results/matrix-64

With `--results NAME` the run is also published: docs/benchmarks/results/NAME.json and NAME.md
(`render` below), which the policy pages include (bench/results.py).
"""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path
from typing import Any

import orjson

from bench import results
from bench.quiet_run import run_quietly
from bench.synthetic_trace import generate

# multi-turn's shape besides its size (production-stack's multi-round QA); bench.multi_turn_tail uses it too
MULTI_TURN = dict(rounds=10, systems=4, system_tokens=1000, first_turn_tokens=2000, answer_tokens=100, think_s=2)
MT = " ".join(f"-p {name}={value}" for name, value in MULTI_TURN.items())
# workload -> (size parameters with {n} scaled by --scale, session rates for light / medium / saturating at 8 replicas)
MATRIX: dict[str, tuple[str, tuple[float, float, float]]] = {
    "shared-prefix": ("-p groups={g} -p prompts_per_group=16", (0.25, 0.5, 1.0)),
    "multi-turn": (f"-p users={{u}} {MT}", (0.1, 0.2, 0.4)),
    "hot-prefix": ("-p requests={r}", (8.0, 16.0, 32.0)),
    "agent-loop": ("-p sessions={s}", (0.25, 0.5, 1.0)),
    "trace": ("-p path={trace}", (0.125, 0.25, 0.5)),
}
LOADS = ("light", "medium", "saturating")
VARIANT = "-P prefix_affinity.preamble_weight=1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--scale", type=int, default=1, help="multiply sizes and rates (with --replicas 8 × scale)")
    parser.add_argument("--loads", default=",".join(LOADS))
    parser.add_argument("--workloads", default=",".join(MATRIX))
    parser.add_argument("--out", type=Path, default=Path("bench-results/matrix"))
    parser.add_argument("--results", metavar="NAME", help="also write docs/benchmarks/results/NAME.json and .md")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    trace = args.out / "trace.jsonl"
    trace.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in generate(1000 * args.scale, 1.0, 16 * args.scale, 0)))
    k = args.scale
    sizes = {"g": 64 * k, "u": 64 * k, "r": 2000 * k, "s": 128 * k, "trace": trace}
    cells = []
    for workload in args.workloads.split(","):
        params, rates = MATRIX[workload]
        for load in args.loads.split(","):
            rate = rates[LOADS.index(load)] * k
            base = (
                f"simulate -w {workload} {params.format(**sizes)} --rate {rate:g} --replicas {args.replicas} "
                f"--no-plots -q"
            )
            cell = args.out / f"{workload}-{load}"
            runs: dict[str, dict[str, Any]] = {}
            started = time.perf_counter()
            for name, extra, out in (
                ("", "", cell),
                (" (preamble_weight=1)", f"--policies prefix_affinity {VARIANT}", cell / "preamble1"),
            ):
                result = run_quietly(shlex.split(f"{base} {extra}"), out)
                runs.update({policy + name: {f: run.get(f) for f in FIELDS} for policy, run in result["runs"].items()})
            figures = {
                "workload": workload,
                "load": load,
                "rate": rate,
                "replicas": args.replicas,
                "requests": result["meta"]["requests"],
                "simulated_s": round(time.perf_counter() - started),
                "command": f"affinity-gateway {base} --out {cell}",
                "runs": runs,
            }
            cells.append(figures)
            print("\n" + render_cell(figures), flush=True)
    print("\n" + aims(cells))
    if args.results:
        print(f"\nwrote {results.write(args.results, results.record('bench.policy_matrix', {'cells': cells}), render)}")


# the figures of each policy's run that the tables show (the rest stays in the run's result.json)
FIELDS = (
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "later_ttft_p90_s",
    "itl_p50_s",
    "e2e_p90_s",
    "cached_ratio",
    "busiest_over_mean",
)


def render(figures: dict[str, Any]) -> str:
    """The aims table over all cells, then every cell, as the published pages show them: each part is a
    snippets section (`aims`, `cells`), so a page can put its reading of the aims between the two."""
    cells = "\n\n".join(render_cell(cell) for cell in figures["cells"])
    return f"{results.section('aims', aims(figures['cells']))}\n\n{results.section('cells', cells)}"


def aims(cells: list[dict[str, Any]]) -> str:
    """Per cell, round robin's and least loaded's TTFT p90 over prefix_affinity's (all requests, then later
    turns where the workload has sessions), prefix_affinity's cached share and busiest over mean, and the
    same ratios for its `preamble_weight=1` variant: the figures the policy's aims are stated in."""
    rows = [
        "| workload | load | RR / LL ÷ PA, TTFT p90 | later turns: RR / LL ÷ PA | PA cached | PA busiest/mean "
        "| with `preamble_weight: 1`: RR / LL ÷ PA | busiest/mean |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        runs = cell["runs"]
        pa, variant = runs["prefix_affinity"], runs["prefix_affinity (preamble_weight=1)"]
        later = "–" if pa.get("later_ttft_p90_s") is None else _over(runs, "prefix_affinity", "later_ttft_p90_s")
        rows.append(
            f"| {cell['workload']} | {cell['load']} | {_over(runs, 'prefix_affinity')} | {later} | "
            f"{pa['cached_ratio']:.2f} | {pa['busiest_over_mean']:.2f} | "
            f"{_over(runs, 'prefix_affinity (preamble_weight=1)')} | {variant['busiest_over_mean']:.2f} |"
        )
    return "\n".join(rows)


def _over(runs: dict[str, dict[str, Any]], name: str, key: str = "ttft_p90_s") -> str:
    """Round robin's and least loaded's figure over this run's: how many times better it is."""
    run = runs[name]
    return f"{runs['round_robin'][key] / run[key]:.2f}× / {runs['least_loaded'][key] / run[key]:.2f}×"


def render_cell(cell: dict[str, Any]) -> str:
    """One cell: its heading (workload and load, so its anchor stays put from run to run), rate, size and how
    long it took, the exact command, the table."""
    return (
        f"### {cell['workload']}, {cell['load']} load\n\n{cell['rate']:g} sessions/s, {cell['replicas']} replicas, "
        f"{cell['requests']} requests; simulated in {cell['simulated_s']:.0f} s:\n\n"
        f"`{cell['command']}` (+ `--policies prefix_affinity {VARIANT}`)\n\n{_table(cell['runs'])}"
    )


def _table(runs: dict[str, dict[str, Any]]) -> str:
    rows = [
        "| policy | TTFT p50 s | TTFT p90 s | TTFT p99 s | later turns TTFT p90 s | ITL p50 ms | e2e p90 s "
        "| cached | busiest/mean |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in runs.items():
        later = "-" if r.get("later_ttft_p90_s") is None else f"{r['later_ttft_p90_s']:.2f}"
        rows.append(
            f"| {name} | {r['ttft_p50_s']:.2f} | {r['ttft_p90_s']:.2f} | {r['ttft_p99_s']:.2f} | {later} | "
            f"{r['itl_p50_s'] * 1000:.0f} | {r['e2e_p90_s']:.1f} | {r['cached_ratio']:.2f} | "
            f"{r['busiest_over_mean']:.2f} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    main()
