"""One `affinity-gateway` run inside a benchmark command, its own output silenced and its result read back.

The commands that assemble tables from many `simulate` / `bench` runs (the matrices, the seeds, the
simulator check, batching, the fingerprint) print one line per run themselves; the run's progress and
table would bury those lines, and its figures are what `result.json` holds.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import orjson

from gateway.cli.main import main as cli


def run_quietly(argv: list[str], out: Path, *, stderr: bool = False) -> dict[str, Any]:
    """`affinity-gateway ARGV --out OUT` with its stdout (and, with `stderr`, its stderr) silenced; the
    run's `result.json` (meta and runs)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.ExitStack() as stack:
        if stderr:
            stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
        cli([*argv, "--out", str(out)])
    loaded: dict[str, Any] = orjson.loads((out / "result.json").read_bytes())
    return loaded
