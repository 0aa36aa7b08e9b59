"""A replica's share of a core (`--replica-cpu`): a real process in a real cgroup, capped, and the group gone after."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.cli_bench import add_bench
from lab.core_budget import CoreBudget, process_name

pytestmark = pytest.mark.timeout(60)

BUSY_S = 2.0
# Spins for BUSY_S of wall time, then prints the CPU seconds it was given.
BUSY = "\n".join(
    [
        "import os, time",
        f"end = time.monotonic() + {BUSY_S}",
        "while time.monotonic() < end: pass",
        "print(sum(os.times()[:2]))",
    ]
)


def _can_make_groups() -> bool:
    try:
        CoreBudget(0.5).close()
    except (OSError, RuntimeError):
        return False
    return True


@pytest.mark.skipif(os.geteuid() != 0 or not _can_make_groups(), reason="cgroups need root and a cpu controller")
def test_a_replica_gets_no_more_than_its_share_and_its_group_goes() -> None:
    budget = CoreBudget(0.25)
    try:
        command = budget.wrapped("test", [sys.executable, "-c", BUSY])
        group = Path(command[3]).parent  # sh -c SCRIPT <group>/cgroup.procs COMMAND...
        assert group.is_dir()
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)
    finally:
        budget.close()
    cpu_s = float(done.stdout)
    assert 0.0 < cpu_s <= 0.25 * BUSY_S * 1.3  # uncapped, a spinning process gets its whole core: 2 s
    assert not group.exists()


# A child that names itself as vLLM's worker does, beside the shell that started it.
NAMED_CHILD = (
    f'{sys.executable} -c \'open("/proc/self/comm", "w").write("computer"); import time; time.sleep(30)\' & sleep 30'
)


@pytest.mark.skipif(os.geteuid() != 0 or not _can_make_groups(), reason="cgroups need root and a cpu controller")
def test_only_the_compute_process_stays_capped() -> None:
    budget = CoreBudget(0.25)
    shell = None
    try:
        command = budget.wrapped("test", ["sh", "-c", NAMED_CHILD])
        procs = Path(command[3])
        shell = subprocess.Popen(command)
        deadline = time.monotonic() + 10
        while len(procs.read_text().split()) < 3 or "computer" not in _names(procs):  # sh, python, sleep
            assert time.monotonic() < deadline, "the child never named itself"
            time.sleep(0.05)
        budget.confine_to("computer")
        assert _names(procs) == ["computer"]
        budget.confine_to("nothing-by-this-name")  # no such process: the group keeps what it has
        assert _names(procs) == ["computer"]
    finally:
        if shell is not None:
            subprocess.run(["pkill", "-P", str(shell.pid)], check=False)
            shell.kill()
            shell.wait(10)
        budget.close()


def _names(procs: Path) -> list[str]:
    """The names of the group's processes still running."""
    return [name for name in map(process_name, procs.read_text().split()) if name]


@pytest.mark.parametrize("share", [0.0, 0.01, 1.5])
def test_a_share_outside_one_core_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="between 0.05 and 1"):
        CoreBudget(share)


def test_bench_refuses_replica_cpu_without_real_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_bench(parser)
    args = parser.parse_args(["--compare", "round_robin", "--replica-cpu", "0.7"])
    args.argv = []
    assert args.run(args) == 2
    assert "--replica-cpu takes a share of a core" in capsys.readouterr().out
