"""Child processes whose whole process tree dies with this process, however this process dies.

vLLM's API server starts an EngineCore, which starts a Worker: three processes in one process
group, ~3.8 GiB. A parent killed with SIGKILL (pytest, `affinity-gateway up`) runs no cleanup, and
PR_SET_PDEATHSIG would reach only the API server (the setting is cleared in its own children), so
the engine would be orphaned. Instead each child leads a new process group, and a watchdog (`sh`,
in a session of its own) blocks reading a pipe whose only writer is this process. End of file comes
when the writer is gone (exit, crash, SIGKILL: the kernel closes its descriptors) or has released
the child, and the watchdog then SIGKILLs the child's group. vLLM puts none of its processes in
another group. Linux and other POSIX systems; `sh` and its `kill` builtin only.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from typing import Any

# $0 is the group id; `read` returns at end of file (nothing is ever written to the pipe).
WATCHDOG = 'read -r _; kill -9 "-$0" 2>/dev/null; exit 0'  # dash's kill takes no "--"


class Tethered:
    """A child leading its own process group; the group is SIGKILLed when this process dies or
    calls `release`. `popen` is the child (signal it, wait for it, read its output as usual)."""

    def __init__(self, args: Sequence[str], **popen: Any) -> None:
        self.popen = subprocess.Popen(list(args), start_new_session=True, **popen)
        read, self._writer = os.pipe()  # non-inheritable: no later child holds the pipe open
        try:
            self._watchdog = subprocess.Popen(
                ["/bin/sh", "-c", WATCHDOG, str(self.popen.pid)],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError:
            self.popen.kill()
            os.close(self._writer)
            raise
        finally:
            os.close(read)

    def release(self, timeout_s: float = 5.0) -> None:
        """SIGKILL whatever is left of the child's group (a dead API server's engine processes) and
        end the watchdog. Call it right after the child is reaped: a group id is not reused while a
        member lives, and in that instant nothing new can have taken an emptied one."""
        if self._writer >= 0:
            os.close(self._writer)
            self._writer = -1
        try:
            self._watchdog.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._watchdog.kill()
            self._watchdog.wait()
