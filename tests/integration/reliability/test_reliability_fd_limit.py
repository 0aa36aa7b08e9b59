"""The gateway's file-descriptor limit, through a real gateway process: raised to the hard limit at start,
and a log event when it nears what it cannot raise.

Started with a soft and hard RLIMIT_NOFILE of 128, and 100 idle client connections opened to it: its open
descriptors pass 80 % of the limit, and the health monitor's next tick logs `fd_limit_near` (before: at a
1,024 limit, 6 of 3,121 requests were reset and nothing was logged). Closing them logs `fd_limit_ok`.
Started with a soft limit of 128 under a hard one of 4,096: it raises the soft limit (`fd_limit_raised`)
and the same 100 connections are no warning (before: the same warning at 128).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.integration.gateway_procs import MODEL, Gateway, pool, running, start_gateway
from tests.integration.reliability_tools import eventually, report
from tests.upstream import FakeReplica, ThreadServer

pytestmark = pytest.mark.timeout(60)

LIMIT = 128


def _gateway_limited_to(tmp_path: Path, url: str, soft: int, hard: int) -> Gateway:
    """A gateway started under (soft, hard) RLIMIT_NOFILE, set by util-linux's prlimit, which execs it (a
    lowered hard limit cannot be raised again, so it is never set in this process)."""
    return start_gateway(tmp_path, {MODEL: pool(("only", url))}, prefix=["prlimit", f"--nofile={soft}:{hard}", "--"])


def test_nearing_the_fd_limit_is_logged(tmp_path: Path) -> None:
    fake = FakeReplica("only")
    with ThreadServer(fake.app) as url, running() as track:
        gateway = track(_gateway_limited_to(tmp_path, url, LIMIT, LIMIT))
        clients = []
        try:
            for _ in range(100):
                clients.append(socket.create_connection(("127.0.0.1", gateway.port), timeout=5))
            eventually(lambda: "fd_limit_near" in gateway.proc.output(), timeout_s=10)
        finally:
            for client in clients:
                client.close()
        eventually(lambda: "fd_limit_ok" in gateway.proc.output(), timeout_s=15)
        line = next(x for x in gateway.proc.output().splitlines() if "fd_limit_near" in x)
        report("fd limit 128, 100 idle clients", [], log=line[:160])


def test_the_soft_limit_is_raised_to_the_hard_one_at_start(tmp_path: Path) -> None:
    fake = FakeReplica("only")
    with ThreadServer(fake.app) as url, running() as track:
        gateway = track(_gateway_limited_to(tmp_path, url, LIMIT, 4096))
        eventually(lambda: "fd_limit_raised" in gateway.proc.output(), timeout_s=10)
        clients = [socket.create_connection(("127.0.0.1", gateway.port), timeout=5) for _ in range(100)]
        try:
            time.sleep(1.0)  # several health ticks with the connections open
            assert "fd_limit_near" not in gateway.proc.output()
        finally:
            for client in clients:
                client.close()
        line = next(x for x in gateway.proc.output().splitlines() if "fd_limit_raised" in x)
        assert '"soft_was":128' in line and '"soft":4096' in line, line
