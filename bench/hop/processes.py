"""Child processes of a benchmark run and the CPU they spend, read from /proc."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def running(
    args: list[str], port: int, env: dict[str, str] | None = None, cwd: Path | None = None, ready_s: float = 60.0
) -> Iterator[int]:
    """Run a child process until the block ends; ready once its port accepts connections (within `ready_s`).
    Yields its pid."""
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        args, stdout=log, stderr=subprocess.STDOUT, env={**(env or os.environ), "PYTHONUNBUFFERED": "1"}, cwd=cwd
    )
    try:
        deadline = time.monotonic() + ready_s
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"{args} exited:\n{log.read().decode(errors='replace')[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), 0.2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` and its live descendants (nginx's or `--workers`' children)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}  # pid -> (parent, cpu seconds)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    tree, grew = {pid}, True
    while grew:
        grew = False
        for child, (parent, _) in stats.items():
            if parent in tree and child not in tree:
                tree.add(child)
                grew = True
    return sum(stats.get(member, (0, 0.0))[1] for member in tree)
