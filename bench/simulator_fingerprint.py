"""Routing decisions unchanged? One digest per simulator cell, over every policy's results.

A speed-up or a restructuring must not change a single routing decision. The simulator is deterministic,
so the same cells give byte-identical results before and after such a change: save the digests on the old
tree, check them on the new one, and quote the check in the commit message.

    .venv/bin/python -m bench.simulator_fingerprint --save /tmp/before.txt     # on the old tree
    .venv/bin/python -m bench.simulator_fingerprint --check /tmp/before.txt    # on the new one
"""

from __future__ import annotations

import argparse
import hashlib
import shlex
import sys
import tempfile
from pathlib import Path

import orjson

from bench.quiet_run import run_quietly

# The peers families at high load (rates from bench.peers_matrix.rate_for), plus the 8-replica multi-turn
# cell with KV events: token keys, exact tables and speculative entries are on the path there.
CELLS = {
    "tenant-chat": "-w tenant-chat --rate 3.4489 --replicas 4 --seed 0",
    "prefix-groups": "-w prefix-groups --rate 13.65 --replicas 4 --seed 1",
    "agent-loop": "-w agent-loop --replicas 4 --seed 0",
    "hot-tenant": "-w hot-tenant --replicas 4 --seed 0",
    "multi-turn-events": "-w multi-turn --replicas 8 --seed 0 --evidence events",
}


def fingerprint(cell: str, out: Path) -> str:
    """sha256 of the cell's per-policy results (the run's metadata, with its timings, left out)."""
    argv = shlex.split(f"simulate {CELLS[cell]} --speedup 10 --no-plots -q")
    runs = run_quietly(argv, out / cell, stderr=True)["runs"]
    return hashlib.sha256(orjson.dumps(runs, option=orjson.OPT_SORT_KEYS)).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--save", type=Path, help="write the digests to this file")
    action.add_argument("--check", type=Path, help="compare with digests saved earlier; exit 1 on a difference")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        digests = {cell: fingerprint(cell, Path(scratch)) for cell in CELLS}
    lines = [f"{cell} {digest}" for cell, digest in digests.items()]
    print("\n".join(lines))
    if args.save:
        args.save.write_text("\n".join(lines) + "\n")
    if args.check:
        saved = dict(line.split() for line in args.check.read_text().splitlines() if line.strip())
        changed = [cell for cell, digest in digests.items() if saved.get(cell) != digest]
        print(f"changed: {', '.join(changed)}" if changed else f"identical: all {len(digests)} cells")
        return 1 if changed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
