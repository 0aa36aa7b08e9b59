"""Children die with their parent, however it dies (`lab.tether`): vLLM's API server starts an
EngineCore that starts a Worker, and a SIGKILLed pytest or `affinity-gateway up` left all three
running (3.8 GiB each replica). vLLM's start-up is slow, so the trees here are its shape in small:
a leader that forks an "engine" that spawns a "worker". `up` is the real CLI path with stubs; it
starts vLLM with the same launcher (`lab.cluster._Child`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from lab.tether import Tethered
from tests.helpers import ROOT, Proc, free_port, python_module, wait_http
from tests.integration.reliability_tools import eventually

pytestmark = pytest.mark.timeout(60)

TREE = """
import multiprocessing as mp, os, sys, time

def worker(path):
    with open(path, "a") as out:
        out.write(f"{os.getpid()}\\n")
    time.sleep(600)

def engine(path):
    mp.get_context("spawn").Process(target=worker, args=(path,)).start()
    worker(path)

if __name__ == "__main__":
    mp.get_context("fork").Process(target=engine, args=(sys.argv[1],)).start()
    worker(sys.argv[1])
"""
PARENT = """
import sys, time
from lab.tether import Tethered
Tethered([sys.executable, *sys.argv[1:]])
time.sleep(600)
"""


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def tree_pids(path: Path) -> list[int]:
    eventually(lambda: path.exists() and len(path.read_text().split()) == 3, timeout_s=20)
    return [int(p) for p in path.read_text().split()]


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (by parent links in /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def kill_all(pids: list[int] | set[int]) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_sigkilled_parent_takes_the_whole_tree_of_its_child(tmp_path: Path) -> None:
    script, pids_file = tmp_path / "tree.py", tmp_path / "pids"
    script.write_text(TREE)
    parent = Proc([sys.executable, "-c", PARENT, str(script), str(pids_file)])
    pids = tree_pids(pids_file)
    try:
        parent.kill()
        eventually(lambda: not any(map(alive, pids)), timeout_s=5, interval_s=0.05)
    finally:
        kill_all(pids)


def test_a_child_that_died_alone_leaves_no_orphan_once_released(tmp_path: Path) -> None:
    """`kill -9` of the API server only: its engine lives on until the parent releases the child."""
    script, pids_file = tmp_path / "tree.py", tmp_path / "pids"
    script.write_text(TREE)
    child = Tethered([sys.executable, str(script), str(pids_file)], cwd=ROOT)
    pids = tree_pids(pids_file)
    try:
        child.popen.kill()
        child.popen.wait(5)
        assert sum(map(alive, pids)) == 2  # the engine and its worker, orphaned
        child.release()
        eventually(lambda: not any(map(alive, pids)), timeout_s=5, interval_s=0.05)
    finally:
        kill_all(pids)


def test_a_sigkilled_up_leaves_no_process_behind() -> None:
    port = free_port()
    up = subprocess.Popen(
        python_module("gateway", "up", "--engine", "sim", "--replicas", "2", "--port", str(port)),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    pids: set[int] = set()
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=30)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200
        pids = descendants(up.pid)
        assert len(pids) >= 3  # two replicas and a gateway (and their watchdogs)
        up.kill()
        up.wait(5)
        eventually(lambda: not any(map(alive, pids)), timeout_s=5, interval_s=0.05)
    finally:
        up.kill()
        kill_all(pids)
