"""Each replica on a fixed share of a core, as each GPU replica has compute of its own (`--replica-cpu`).

On a small machine the replicas share their cores with the router and the load generator. A router that
piles the work onto one replica leaves the other's core to everything else, and the busy replica runs no
slower for it; a fleet of GPU replicas has no such trade, and a replica doing nine tenths of the work there
queues at nine tenths of the load. So, for a head-to-head that ranks routers by how they place work:
- each replica gets a CPU cgroup capped at `share` of one core (CFS bandwidth, a quota per 100 ms
  period): the share a replica leaves idle is nobody's gain;
- within its share it has precedence over the rest (a high weight), so the router and the load generator
  run in what the replicas leave, at least 1 − share of every core, and a router's own CPU does not slow the
  engine;
- once a replica is up, only its compute process stays capped (`confine_to`). vLLM's engine core waits for
  its worker by spinning (`sched_yield`) for a second after each step, so with the whole replica in one
  group a busy replica spent half its share spinning and computed at half speed, twice as slow with a
  second request as with one. A GPU replica's engine core spins on the host's CPU, not on the GPU's
  compute: the cap stands for the accelerator.

Linux, as root: the cgroup v1 `cpu` hierarchy, mounted privately where it is not visible (`ip netns exec`
mounts a fresh /sys, hiding /sys/fs/cgroup), or cgroup v2 with its cpu controller.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

PERIOD_US = 100_000
V1_SHARES = 8192  # cpu.shares: 8× the default 1024 of everything else
V2_WEIGHT = 800  # cpu.weight: 8× the default 100
V1_ROOT = Path("/sys/fs/cgroup/cpu")
V2_ROOT = Path("/sys/fs/cgroup")


def usable_share(share: float) -> bool:
    """A share of one core a replica can run on (the one bound the CLI and the budget apply)."""
    return 0.05 <= share <= 1.0


class CoreBudget:
    """The replicas' cgroups: `wrapped` puts a command into a group of its own, `close` removes them all."""

    def __init__(self, share: float) -> None:
        if not usable_share(share):
            raise ValueError(f"--replica-cpu takes a share of one core between 0.05 and 1, not {share}")
        self.share = share
        self._mounted: Path | None = None
        self._groups: list[Path] = []
        self._root, self._v2 = self._find_root()

    def wrapped(self, name: str, command: list[str]) -> list[str]:
        """`command` started in a new group `name`: the shell writes its own pid into the group, then becomes
        the command, whose children stay in the group."""
        group = self._root / f"affinity-lab-{name}-{time.monotonic_ns()}"
        group.mkdir()
        self._groups.append(group)
        quota = round(self.share * PERIOD_US)
        if self._v2:
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            (group / "cpu.weight").write_text(str(V2_WEIGHT))
        else:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
            (group / "cpu.shares").write_text(str(V1_SHARES))
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs"), *command]

    def confine_to(self, compute: str) -> None:
        """Leave in each group only its processes named `compute` (their `comm`); move the rest (the replica's
        API server and engine core) to the root group. A group without such a process keeps everything: no
        replica runs uncapped because its processes were named otherwise."""
        for group in self._groups:
            pids = (group / "cgroup.procs").read_text().split()
            computing = {pid for pid in pids if process_name(pid).startswith(compute)}
            if not computing:
                continue
            for pid in pids:
                if pid not in computing:
                    try:
                        (self._root / "cgroup.procs").write_text(pid)
                    except ProcessLookupError:  # exited meanwhile
                        pass

    def close(self) -> None:
        """Remove the groups once their processes have exited (called after the replicas were waited for)."""
        for group in self._groups:
            for _ in range(50):  # a killed process leaves its group a moment later
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
        self._groups.clear()
        if self._mounted is not None:
            subprocess.run(["umount", str(self._mounted)], check=False, capture_output=True)
            self._mounted.rmdir()
            self._mounted = None

    def _find_root(self) -> tuple[Path, bool]:
        """Where the cpu controller's groups are made, and whether it is cgroup v2."""
        if (V1_ROOT / "cpu.cfs_quota_us").exists():
            return V1_ROOT, False
        controllers = V2_ROOT / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            subtree = V2_ROOT / "cgroup.subtree_control"
            if "cpu" not in subtree.read_text().split():
                subtree.write_text("+cpu")
            return V2_ROOT, True
        mount = Path(tempfile.mkdtemp(prefix="affinity-cgroup-cpu-"))
        done = subprocess.run(["mount", "-t", "cgroup", "-o", "cpu", "none", str(mount)], capture_output=True)
        if done.returncode != 0:
            mount.rmdir()
            raise RuntimeError(
                "--replica-cpu needs the cgroup cpu controller and root: none is visible, and mounting "
                f"cgroup v1's cpu hierarchy failed: {done.stderr.decode(errors='replace').strip()}"
            )
        self._mounted = mount
        return mount, False


def process_name(pid: str) -> str:
    """A process's name (its `comm`), or "" once it has exited."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
