"""Instructions per proxied request: our gateway's own work, counted by callgrind, before and after a change.

    python -m bench.hop.instructions [--baseline-tree ../old] [--policy prefix_affinity] [--stream] [--seconds 20]
    python -m bench.hop.instructions --stream --keep out/ && callgrind_annotate --inclusive=yes out/callgrind-*.out.1

The hop's requests per second and CPU per request move with whatever else the host runs: on a busy day
the bare proxy's rate changes by a third within one run, and a 5 % change shows in one run and reverses
in the next. An instruction count does not: the gateway runs under `valgrind --tool=callgrind` (about
fifty times slower, so wrk's few connections keep it saturated), its counters are zeroed once it is
warm (`callgrind_control --zero`), wrk drives it for `--seconds`, and the count is read at the end
(`callgrind_control --dump`) and divided by the requests wrk completed. Same set-up as the hop (three
zero-delay replicas, shipped defaults, wrk's prompts); with `--baseline-tree` the same for another source
tree (built as `make install` builds ours, else its policy runs interpreted), one after the other: the
two counts need no interleaving. A run differs from the next by about a percent (how requests fall into
event-loop turns), so compare changes larger than that.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench.hop.processes import running
from bench.hop.rig import fake_replicas, gateway_config, wrk
from lab.cluster import free_port

STARTUP_S = 300.0  # the gateway's start-up (its imports) under callgrind
_TOTAL = re.compile(r"^(?:summary|totals): (\d+)", re.MULTILINE)


def count(tree: Path | None, replicas: list[str], args: argparse.Namespace, workdir: Path) -> tuple[int, int]:
    """(requests, instructions) of one gateway from `tree` (None: this checkout) under wrk."""
    port = free_port()
    config = gateway_config(port, replicas, args.policy, workdir)
    out = workdir / f"callgrind-{port}.out"
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        "--dump-instr=no",
        "--trace-children=no",
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        str(config),
    ]
    url = f"http://127.0.0.1:{port}"
    # `-m` puts the working directory first on sys.path: a baseline's `gateway` is imported
    with running(command, port, cwd=tree, ready_s=STARTUP_S) as pid:
        wrk(url, 1, args.connections, args.stream, 5)  # warm: imports on first use, caches, the collector's pace
        subprocess.run(["callgrind_control", "--zero", str(pid)], check=True, capture_output=True, timeout=60)
        requests, failed, _, _ = wrk(url, 1, args.connections, args.stream, args.seconds)
        subprocess.run(["callgrind_control", "--dump", str(pid)], check=True, capture_output=True, timeout=60)
    if failed:
        raise RuntimeError(f"{failed} requests failed against the gateway from {tree or 'this checkout'}")
    dumps = sorted(workdir.glob(f"{out.name}*"), key=lambda p: p.stat().st_mtime)
    counted = [int(m[1]) for m in (_TOTAL.search(p.read_text(errors="replace")) for p in dumps) if m]
    if not counted:
        raise RuntimeError(f"callgrind wrote no count for {tree or 'this checkout'}")
    return requests, counted[0]  # the first dump after zeroing: the measured stretch (the last is the exit's)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hop.instructions", description=__doc__.split("\n")[0])
    parser.add_argument("--baseline-tree", type=Path, help="also count a gateway from this source tree, first")
    parser.add_argument("--policy", default="prefix_affinity", help="a policy, with +idle as bench.hop takes it")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument(
        "--keep", type=Path, help="keep callgrind's output in this folder (for `callgrind_annotate --inclusive=yes`)"
    )
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        parser.error("valgrind is not installed (apt-get install valgrind)")
    trees: list[tuple[str, Path | None]] = [("ours", None)]
    if args.baseline_tree is not None:
        trees.insert(0, ("base", args.baseline_tree.resolve()))
    rows = []
    with ExitStack() as stack:
        workdir = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        workdir.mkdir(parents=True, exist_ok=True)
        replicas = fake_replicas(stack)
        for name, tree in trees:
            requests, instructions = count(tree, replicas, args, workdir)
            rows.append((name, requests, instructions / max(requests, 1)))
    mode = "4-event streams" if args.stream else "whole answers"
    print(f"{args.policy}, {mode}, wrk -t1 -c{args.connections} for {args.seconds:g} s under callgrind\n")
    print("| gateway | requests | instructions per request | / first |")
    print("|---|---|---|---|")
    for name, requests, per_request in rows:
        print(f"| {name} | {requests:,} | {per_request / 1e3:,.0f}k | {per_request / rows[0][2]:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
