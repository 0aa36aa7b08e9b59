"""A log event when the gateway nears its file-descriptor limit, through a real gateway process.

The gateway is started with a soft RLIMIT_NOFILE of 128 and 100 idle client connections are opened to
it: its open descriptors pass 80 % of the limit, and the health monitor's next tick logs `fd_limit_near`
(before: at a 1,024 limit, 6 of 3,121 requests were reset and nothing was logged). Closing them logs
`fd_limit_ok`.
"""

from __future__ import annotations

import resource
import socket
from pathlib import Path

import pytest

from tests.integration.gateway_procs import MODEL, pool, running, start_gateway
from tests.integration.reliability_tools import eventually, report
from tests.upstream import FakeReplica, ThreadServer

pytestmark = pytest.mark.timeout(60)

LIMIT = 128


def test_nearing_the_fd_limit_is_logged(tmp_path: Path) -> None:
    fake = FakeReplica("only")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with ThreadServer(fake.app) as url, running() as track:
        resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, hard))  # inherited by the gateway process only
        try:
            gateway = track(start_gateway(tmp_path, {MODEL: pool(("only", url))}))
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
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
