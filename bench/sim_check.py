"""The simulator checked against real processes: one workload through `affinity-gateway bench --compare`
(per policy, fresh sim replica stubs and a gateway, real HTTP streaming) and through `affinity-gateway
simulate` with the same replicas and speed-up, side by side per policy. The simulator is only worth its
verdicts where it agrees with real processes, so the two are published as one table.

    .venv/bin/python -m bench.sim_check --out bench-results/sim-check-sp [--results NAME] \\
        -w shared-prefix -p groups=48 -p prompts_per_group=6 -p answer_tokens=32 --rate 8

Every argument this command does not know is the workload's, passed to both. `--results NAME` also
writes docs/benchmarks/results/NAME.json and NAME.md (bench/results.py).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from bench import results
from bench.quiet_run import run_quietly
from lab.cli_bench import ALL_POLICIES

BENCH: tuple[str, ...] = ("ttft_p50_s", "ttft_p90_s", "cached_ratio", "busiest_over_mean", "requests", "errors")
BENCH += ("target_session_rate", "achieved_session_rate", "lag_p99_s", "lag_max_s")
SIMULATE = ("ttft_p50_s", "ttft_p90_s", "cached_ratio")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--policies", default=",".join(ALL_POLICIES))
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--speedup", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("bench-results/sim-check"))
    parser.add_argument("--results", metavar="NAME", help="also write docs/benchmarks/results/NAME.json and .md")
    args, workload = parser.parse_known_args()
    cluster = ["--replicas", str(args.replicas), "--speedup", f"{args.speedup:g}", *workload, "--no-plots", "-q"]
    argvs = {
        "bench": ["bench", "--compare", args.policies, *cluster],
        "simulate": ["simulate", "--policies", args.policies, *cluster],
    }
    commands = {kind: [*argv, "--out", str(args.out / kind)] for kind, argv in argvs.items()}
    runs = {}
    for kind, command in commands.items():
        print(f"affinity-gateway {shlex.join(command)}", flush=True)
        runs[kind] = run_quietly(argvs[kind], args.out / kind)["runs"]
    figures = {
        "commands": [f"affinity-gateway {shlex.join(command)}" for command in commands.values()],
        "policies": {
            policy: {
                "bench": {key: runs["bench"][policy].get(key) for key in BENCH},
                "simulate": {key: runs["simulate"][policy].get(key) for key in SIMULATE},
            }
            for policy in args.policies.split(",")
        },
    }
    print("\n" + render(figures))
    if args.results:
        print(f"\nwrote {results.write(args.results, results.record('bench.sim_check', figures), render)}")


def render(figures: dict[str, Any]) -> str:
    """The two commands, then per policy real against simulated TTFT and cached ratio, the real run's load
    spread, and whether the client kept up (achieved rate against the target, how late it sent)."""
    rows = [
        "```sh",
        *figures["commands"],
        "```",
        "",
        "| policy | bench TTFT p50 / p90 s | simulate TTFT p50 / p90 s | bench cached | simulate cached | "
        "bench busiest/mean | client: target → achieved sessions/s, lag p99 / max |",
        "|---|---|---|---|---|---|---|",
    ]
    for policy, both in figures["policies"].items():
        real, sim = both["bench"], both["simulate"]
        rows.append(
            f"| {policy} | {real['ttft_p50_s']:.3f} / {real['ttft_p90_s']:.3f} | "
            f"{sim['ttft_p50_s']:.3f} / {sim['ttft_p90_s']:.3f} | {real['cached_ratio']:.3f} | "
            f"{sim['cached_ratio']:.3f} | {real['busiest_over_mean']:.2f} | "
            f"{real['target_session_rate']:.2f} → {real['achieved_session_rate']:.2f}, "
            f"{real['lag_p99_s'] * 1000:.1f} / {real['lag_max_s'] * 1000:.1f} ms |"
        )
    requests = {both["bench"]["requests"] for both in figures["policies"].values()}
    errors = sum(both["bench"]["errors"] for both in figures["policies"].values())
    rows += ["", f"{' or '.join(str(r) for r in sorted(requests))} requests per policy, {errors} errors."]
    return "\n".join(rows)


if __name__ == "__main__":
    main()
