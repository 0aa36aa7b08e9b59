"""Static against continuous batching, side by side: the same seeded workload with varied answer
lengths through `affinity-gateway bench --compare` against fresh sim replica stubs started with
`--batching continuous` and then `--batching static`, one Markdown table (TTFT, e2e, output
throughput) and the exact bench commands behind it. Routing is round robin by default, so the
replicas' batching is the only thing that differs between the two rows.

    .venv/bin/python -m bench.batching --out bench-results/batching [--results batching]

`--results NAME` also writes docs/benchmarks/results/NAME.json and NAME.md (bench/results.py), which the
batching page includes.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from bench import results
from bench.quiet_run import run_quietly
from replica_stub.scheduler import BATCHING


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--speedup", type=float, default=10.0, help="sim replicas' speed factor")
    parser.add_argument("--policy", default="round_robin", help="the gateway's routing policy in both runs")
    parser.add_argument("--concurrency", type=int, default=16, help="closed loop: requests in flight")
    parser.add_argument(
        "--params",
        default="-p requests=200 -p short_tokens=32 -p long_tokens=512 -p long_share=0.2",
        help="varied-output workload parameters",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench-results/batching"))
    parser.add_argument("--results", metavar="NAME", help="also write docs/benchmarks/results/NAME.json and .md")
    args = parser.parse_args()
    base = (
        f"bench --compare {args.policy} --replicas {args.replicas} --speedup {args.speedup:g} -w varied-output "
        f"{args.params} --concurrency {args.concurrency} --seed {args.seed} --no-plots -q"
    )
    runs: dict[str, dict[str, Any]] = {}
    commands = []
    for mode in BATCHING:
        run = f"{base} --batching {mode}"
        command = f"{run} --out {args.out / mode}"
        print(f"`affinity-gateway {command}`", flush=True)
        result = run_quietly(shlex.split(run), args.out / mode)
        runs[mode] = {key: result["runs"][args.policy][key] for key in ("requests", "errors", *COLUMNS.values())}
        commands.append(f"affinity-gateway {command}")
    figures = {
        "requests": result["meta"]["requests"],
        "replicas": args.replicas,
        "speedup": args.speedup,
        "concurrency": args.concurrency,
        "policy": args.policy,
        "commands": commands,
        "runs": runs,
    }
    print("\n" + render(figures))
    if args.results:
        print(f"\nwrote {results.write(args.results, results.record('bench.batching', figures), render)}")


COLUMNS = {
    "TTFT p50 s": "ttft_p50_s",
    "TTFT p90 s": "ttft_p90_s",
    "e2e p50 s": "e2e_p50_s",
    "e2e p90 s": "e2e_p90_s",
    "out tok/s": "output_tokens_per_s",
}


def render(figures: dict[str, Any]) -> str:
    """The bench commands behind the two rows, the set-up in one line, then one row per batching mode
    and static's figures over continuous's."""
    runs: dict[str, dict[str, Any]] = figures["runs"]
    rows = [
        "```sh",
        *figures["commands"],
        "```",
        "",
        f"{figures['requests']} requests, {figures['replicas']} sim replicas at speedup {figures['speedup']:g}, "
        f"{figures['concurrency']} in flight, routing {figures['policy']}:",
        "",
        "| batching | requests | errors | " + " | ".join(COLUMNS) + " |",
        "|---|---|---|" + "---|" * len(COLUMNS),
    ]
    for mode, run in runs.items():
        rows.append(
            f"| {mode} | {run['requests']} | {run['errors']} | "
            + " | ".join(f"{run[k]:.0f}" if k == "output_tokens_per_s" else f"{run[k]:.3f}" for k in COLUMNS.values())
            + " |"
        )
    static, continuous = runs["static"], runs["continuous"]
    ratios = [f"{static[k] / continuous[k]:.2f}x" if continuous[k] else "-" for k in COLUMNS.values()]
    rows.append("| static / continuous | | | " + " | ".join(ratios) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
