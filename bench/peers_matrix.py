"""The published head-to-head: our policy against the routers users would pick instead (SGLang Model
Gateway, sglang-router, vllm-router), every contestant in front of the same fresh sim replicas, on
workload families the policy was not tuned on, each at a moderate and a tight load.

Loads are fractions of the fleet's ideal capacity: the arrival rate at which the replicas would be
that busy if every prefix were computed once in the fleet and then always hit (`ideal_busy_s`).
Round robin, which rarely hits, is past its own capacity at the tight load: that is the point.

    make peers && .venv/bin/python -m bench.peers_matrix --out bench-results/peers
    .venv/bin/python -m bench.peers_matrix --families tenant-chat --loads high \
        --contestants prefix_affinity,smg:cache_aware

Prints the one-screen table of the head-to-head page (TTFT p90, of later turns for session workloads;
cached share; busiest/mean) and each cell's `affinity-gateway bench` command. `--report --results peers`
publishes it: docs/benchmarks/results/peers.json and peers.md (bench/results.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex
import time
from pathlib import Path
from statistics import median
from typing import Any

import orjson

from bench import results
from bench.stress_matrix import CELLS as STRESS_CELLS
from bench.stress_matrix import PRESSURE
from gateway.cli.main import main as cli
from lab.workloads import Session, build
from replica_stub.engine.timing import TimingModel

CONTESTANTS = (
    "prefix_affinity",
    "round_robin",
    "smg:cache_aware",
    "smg:prefix_hash",
    "smg:round_robin",
    "sglang:cache_aware",
    "vllm-router:cache_aware",
    "vllm-router:consistent_hash",
)
# family -> workload and its parameters (the workload's registered defaults otherwise)
FAMILIES: dict[str, tuple[str, str]] = {
    "tenant-chat": ("tenant-chat", ""),
    "prefix-groups": ("prefix-groups", ""),
    "agent-loop": ("agent-loop", "-p sessions=48"),
    "hot-tenant": ("hot-tenant", ""),
    "tenant-bursts": ("tenant-bursts", ""),
    "tenant-bursts-pressure": ("tenant-bursts", PRESSURE),
    "rag-chunks": ("rag-chunks", ""),
    "decode-heavy": ("decode-heavy", ""),
}
LOADS = {"moderate": 0.5, "high": 0.9}


def _stress_rates() -> dict[str, dict[str, float]]:
    """family -> load -> the `--rate` of its cell in the oracle table (bench.stress_matrix, read from its
    cells), so the two tables compare cell by cell: a burst's rate is not a session arrival rate that
    ideal_busy_s can set."""
    rates: dict[str, dict[str, float]] = {}
    for name, arguments in STRESS_CELLS.items():
        family, _, load = name.partition(", ")
        if load in LOADS:  # not the fingerprint cells
            words = shlex.split(arguments)
            rates.setdefault(family, {})[load] = float(words[words.index("--rate") + 1])
    return rates


FIXED_RATES = _stress_rates()
REPLICAS, SPEEDUP, BLOCK = 4, 10.0, 16


DEFAULT_TIMING = TimingModel()  # frozen: one shared default


def ideal_busy_s(sessions: list[Session], timing: TimingModel = DEFAULT_TIMING) -> float:
    """Replica-seconds (at speedup 1) the workload needs if each block of text were prefilled once in
    the fleet and every later request hit it: prefill of first-seen blocks, one step per request, and
    each answer token's own share of a batched decode step. Words are tokens (the sim tokenizer)."""
    seen: set[int] = set()
    busy_ms = 0.0
    for s in sessions:
        history: list[str] = s.system.split()
        for turn in s.user_turns:
            history += turn.split()
            blocks = [hash(tuple(history[:end])) for end in range(BLOCK, len(history) + 1, BLOCK)]
            cached = next((i for i, b in enumerate(blocks) if b not in seen), len(blocks)) * BLOCK
            seen.update(blocks)
            busy_ms += timing.solo_prefill_ms(len(history) - cached, cached)
            busy_ms += s.max_tokens * timing.decode_ms(len(history) + s.max_tokens // 2)
            history += ["answer"] * s.max_tokens
    return busy_ms / 1000


def rate_for(workload: str, params: dict[str, str], load: float) -> float:
    """The session arrival rate at which the ideal fleet is `load` busy (sim replicas at SPEEDUP): its
    work spread over the arrivals' span plus a session's own think time (a conversation outlives its start)."""
    base = build(workload, params)
    think_s = max(s.think_s * (len(s.user_turns) - 1) for s in base)
    span_s = ideal_busy_s(base) / SPEEDUP / (REPLICAS * load) - think_s
    return (len(base) - 1) / span_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--loads", default=",".join(LOADS))
    parser.add_argument("--contestants", default=",".join(CONTESTANTS))
    parser.add_argument("--out", type=Path, default=Path("bench-results/peers"))
    parser.add_argument("--seeds", default="0", help="workload seeds per cell; the table shows each figure's median")
    parser.add_argument("--report", action="store_true", help="only print the table of the cells already in --out")
    parser.add_argument("--results", metavar="NAME", help="also write docs/benchmarks/results/NAME.json and .md")
    args = parser.parse_args()
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for family in args.families.split(","):
        workload, params = FAMILIES[family]
        pairs = dict(p.split("=", 1) for p in shlex.split(params)[1::2])
        for load in args.loads.split(","):
            fixed = FIXED_RATES.get(family, {}).get(load)
            rate = fixed if fixed is not None else rate_for(workload, pairs, LOADS[load])
            for seed in (int(s) for s in args.seeds.split(",")):
                out = args.out / f"{family}-{load}" / f"seed-{seed}"
                command = (
                    f"bench --compare {args.contestants} -w {workload} {params} --rate {rate:.3g} --seed {seed} "
                    f"--replicas {REPLICAS} --speedup {SPEEDUP:g} --no-plots -q --out {out}"
                )
                if not args.report:
                    started = time.perf_counter()
                    with contextlib.redirect_stdout(io.StringIO()):
                        code = cli(shlex.split(command))
                    took = time.perf_counter() - started
                    print(
                        f"{family} {load} ({rate:.3g} sessions/s) seed {seed}: {took:.0f} s, exit {code}\n"
                        f"  affinity-gateway {command}",
                        flush=True,
                    )
                if not (out / "result.json").exists():
                    print(f"{family} {load} seed {seed}: no result in {out}", flush=True)
                    continue
                cells.setdefault((family, load), []).append(orjson.loads((out / "result.json").read_bytes()))
    figures = summarize(cells, args.contestants.split(","))
    print("\n" + render(figures))
    if args.results:
        print(f"\nwrote {results.write(args.results, results.record('bench.peers_matrix', figures), render)}")


def summarize(cells: dict[tuple[str, str], list[dict[str, Any]]], contestants: list[str]) -> dict[str, Any]:
    """The published figures: per cell and contestant, TTFT p90 in ms, cached share and busiest over
    mean, each the median over the cell's seeds, and the errors summed. Session workloads count their
    later turns (the ones whose history a replica can hold). A contestant missing from a seed's run
    is None: a median over fewer seeds than the row says would mislead."""
    rows = []
    for (family, load), runs_by_seed in cells.items():
        figures: dict[str, dict[str, float] | None] = {}
        for name in contestants:
            runs = [result["runs"][name] for result in runs_by_seed if name in result["runs"]]
            if len(runs) < len(runs_by_seed):
                figures[name] = None
                continue
            p90 = [r["later_ttft_p90_s"] if r.get("later_ttft_p90_s") is not None else r["ttft_p90_s"] for r in runs]
            figures[name] = {
                "ttft_p90_ms": median(p90) * 1000,
                "cached": median([r["cached_ratio"] for r in runs]),
                "busiest_over_mean": median([r["busiest_over_mean"] for r in runs]),
                "errors": sum(r["errors"] for r in runs),
            }
        share = None if family in FIXED_RATES else LOADS[load]
        rows.append({"family": family, "load": load, "share": share, "seeds": len(runs_by_seed), "runs": figures})
    return {"contestants": contestants, "cells": rows}


def render(figures: dict[str, Any]) -> str:
    """One row per cell, one column per contestant: TTFT p90 ms / cached share / busiest over mean."""
    contestants: list[str] = figures["contestants"]
    rows = ["| workload | load | seeds | " + " | ".join(contestants) + " |"]
    rows.append("|---|---|---|" + "---|" * len(contestants))
    for cell in figures["cells"]:
        share = cell.get("share")
        load = f"{cell['load']} ({share:.0%})" if share is not None else f"{cell['load']} (stress rate)"
        line = [cell["family"], load, str(cell["seeds"])]
        for name in contestants:
            r = cell["runs"].get(name)
            if r is None:
                line.append("missing")
                continue
            line.append(
                f"{r['ttft_p90_ms']:.0f} / {r['cached']:.2f} / {r['busiest_over_mean']:.2f}"
                + (f", {r['errors']} err" if r["errors"] else "")
            )
        rows.append("| " + " | ".join(line) + " |")
    return (
        "\n".join(rows) + "\n\nEach cell: TTFT p90 ms (of later turns for the session workloads: tenant-chat, "
        "agent-loop, decode-heavy) / cached share of the prompt tokens / busiest replica's requests ÷ the mean; "
        "medians over the row's seeds."
    )


if __name__ == "__main__":
    main()
