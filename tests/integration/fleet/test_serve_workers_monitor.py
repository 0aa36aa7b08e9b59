"""`serve --workers N` shares one monitor: worker 0 probes, scrapes and lists the replicas, the other
workers take its findings (`gateway.replicas.shared_monitor`), so the replicas see one gateway's background
traffic; a replica worker 0 finds down is avoided by every worker; with worker 0 gone, the others ask the
replicas themselves until it is back. Real processes: the supervisor, its workers, two fake replicas."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.fleet.test_serve_workers import _all_up, _children
from tests.integration.gateway_procs import MODEL, pool, running, start_gateway
from tests.integration.reliability_tools import eventually
from tests.upstream import FakeReplica, ThreadServer

pytestmark = pytest.mark.timeout(120)
WORKERS = 3
INTERVAL_S = 0.1  # start_gateway's health.interval_s


def _answered_by(url: str) -> str:
    """One request on a fresh connection (the kernel picks a worker per connection): the replica's id."""
    body = {"model": MODEL, "prompt": "Say hello", "max_tokens": 2}
    resp = httpx.post(f"{url}/v1/completions", json=body, timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.headers["X-Replica-Id"]


def _probes_per_s(replica: FakeReplica, seconds: float) -> float:
    before = replica.gets["/health"]
    time.sleep(seconds)
    return (replica.gets["/health"] - before) / seconds


def test_workers_share_one_monitor_and_fall_back_without_its_owner(tmp_path: Path) -> None:
    a, b = FakeReplica("a"), FakeReplica("b")
    with ThreadServer(a.app) as url_a, ThreadServer(b.app) as url_b, running() as track:
        gateway = track(
            start_gateway(tmp_path, {MODEL: pool(("a", url_a), ("b", url_b))}, flags=["--workers", str(WORKERS)])
        )
        eventually(lambda: _all_up(gateway.url, WORKERS), timeout_s=30, interval_s=0.2)
        one_gateway = 1 / INTERVAL_S
        shared = _probes_per_s(a, 2.0)
        assert shared <= 1.5 * one_gateway, f"{shared:.1f} probes/s: each worker probes ({WORKERS} x {one_gateway:g})"

        b.healthy = False  # worker 0 finds it down; every worker must stop sending it requests
        time.sleep(5 * INTERVAL_S + 0.5)
        assert {_answered_by(gateway.url) for _ in range(30)} == {"a"}

        owner = min(_children(gateway.proc.popen.pid))  # the workers start in order: worker 0 first
        os.kill(owner, signal.SIGKILL)
        alone = _probes_per_s(a, 0.4)  # the others ask the replicas themselves while worker 0 restarts
        assert alone > 0 and {_answered_by(gateway.url) for _ in range(10)} == {"a"}
        b.healthy = True
        eventually(lambda: _all_up(gateway.url, WORKERS), timeout_s=30, interval_s=0.2)
        eventually(lambda: {_answered_by(gateway.url) for _ in range(20)} == {"a", "b"}, timeout_s=10)
        eventually(lambda: _probes_per_s(a, 1.0) <= 1.5 * one_gateway, timeout_s=10)  # worker 0 is back: one monitor
