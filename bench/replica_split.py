"""How a real-vLLM head-to-head's work split between the replicas, from the replicas' own log lines.

    affinity-gateway bench --compare ... --engine vllm --rounds 2 --out DIR > bench.log 2>&1
    python -m bench.replica_split bench.log --contestants prefix_affinity,round_robin,smg,sglang,vllm-router

Why: the bench's busiest ÷ mean counts requests (named in the answers, or counted by the replicas:
`lab.replica_counts`), and requests differ in size; this counts the work. vLLM's engine
logs, every 10 s, the prompt and generation tokens per second it computed; summed over one contestant's
run (each run starts fresh replicas, whose `non-default args` line opens it) they give each replica's
share of the work, whoever routed it. `--contestants` names the runs in the order the bench ran them
(its `--compare` list, repeated once per round).
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from lab.results import busiest_over_mean

_RUN_START = re.compile(r"^\[vllm-0\] .*non-default args")
_THROUGHPUT = re.compile(
    r"^\[vllm-(\d+)\] .*Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s"
)
LOG_INTERVAL_S = 10.0  # vLLM's stats logger's period


def split(lines: Iterable[str]) -> list[dict[int, tuple[float, float]]]:
    """Per run, per replica index: (prompt tokens, generated tokens) computed."""
    runs: list[defaultdict[int, list[float]]] = []
    for line in lines:
        if _RUN_START.match(line):
            runs.append(defaultdict(lambda: [0.0, 0.0]))
        elif runs and (found := _THROUGHPUT.match(line)):
            tokens = runs[-1][int(found.group(1))]
            tokens[0] += float(found.group(2)) * LOG_INTERVAL_S
            tokens[1] += float(found.group(3)) * LOG_INTERVAL_S
    return [{replica: (t[0], t[1]) for replica, t in sorted(run.items())} for run in runs]


def render(runs: list[dict[int, tuple[float, float]]], contestants: list[str]) -> str:
    lines = [
        "| run | prompt tokens per replica | busiest ÷ mean | generated tokens per replica | busiest ÷ mean |",
        "|---|---|---|---|---|",
    ]
    for k, run in enumerate(runs):
        name = f"{contestants[k % len(contestants)]} #{k // len(contestants) + 1}" if contestants else f"run {k + 1}"
        prompt = [p for p, _ in run.values()]
        generated = [g for _, g in run.values()]
        lines.append(
            f"| {name} | {' / '.join(f'{p:,.0f}' for p in prompt)} | {busiest_over_mean(prompt):.2f} | "
            f"{' / '.join(f'{g:,.0f}' for g in generated)} | {busiest_over_mean(generated):.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replica_split", description=__doc__.split("\n")[0])
    parser.add_argument("log", type=Path, help="the bench's output, replicas' lines included")
    parser.add_argument("--contestants", default="", help="comma-separated, in the order the bench ran them")
    args = parser.parse_args(argv)
    with args.log.open(errors="replace") as log:
        runs = split(log)
    print(render(runs, [c for c in args.contestants.split(",") if c]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
