"""Run this test process inside a loopback-only network namespace (as root, where `ip netns` works).

vLLM binds its KV-event sockets only on wildcard endpoints (`tcp://*:port`). Inside a fresh
namespace with only `lo` up (`lab.peers.namespace`, as `bench` uses for peers), `*`
reaches nothing past this machine, and neither can anything vLLM might try to reach. The
namespace is joined with setns(2) while pytest is still single-threaded (at collection), so
every later thread, socket and child process is inside it. Its name is deleted at exit (also
after a failure); the namespace itself lives as long as this process.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import subprocess
import threading

from lab.peers import namespace

CLONE_NEWNET = 0x40000000


def join_loopback_namespace() -> bool:
    """True if this process is now in a fresh loopback-only namespace; False where that cannot be done."""
    if os.geteuid() != 0 or shutil.which("ip") is None or threading.active_count() != 1:
        return False
    scope = namespace()
    try:
        name = scope.__enter__()[-1]
    except (OSError, subprocess.CalledProcessError):
        return False
    atexit.register(scope.__exit__, None, None, None)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        return ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) == 0
    finally:
        os.close(fd)
