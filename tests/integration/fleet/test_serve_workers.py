"""`serve --workers N` with real processes: one port, N gateways, a supervisor that restarts a
crashed worker, gives up on a crash loop and drains all of them on SIGTERM.

Which worker answered is read from the merged /metrics (`worker` label): that the label counts
add up to the requests sent is also the check that any worker's /metrics covers all of them.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import Proc, free_port, python_module
from tests.integration.gateway_procs import MODEL, Gateway, pool, running, start_gateway, start_stub
from tests.integration.reliability_tools import eventually

pytestmark = pytest.mark.timeout(120)
GRACE_S = 2.0


def _completion(url: str) -> int:
    """One request on a fresh connection (the kernel picks a worker per connection)."""
    body = {"model": MODEL, "prompt": "Say hello", "max_tokens": 2}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=10).status_code


def _per_worker(url: str) -> tuple[dict[str, float], dict[str, float]]:
    """(requests answered by each worker, which workers answered the merged scrape)."""
    requests: dict[str, float] = {}
    up: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == "affinity_gateway_requests_total":
                worker = sample.labels["worker"]
                requests[worker] = requests.get(worker, 0.0) + sample.value
            elif sample.name == "affinity_gateway_worker_up":
                up[sample.labels["worker"]] = sample.value
    return requests, up


def _all_up(url: str, workers: int = 2) -> bool:
    try:
        return _per_worker(url)[1] == {str(i): 1.0 for i in range(workers)}
    except httpx.HTTPError:
        return False


def _children(pid: int) -> set[int]:
    """Live child processes of `pid` (the workers of a supervisor), from /proc."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.add(int(entry.name))
    return found


def _start(tmp_path: Path, track: Callable[[Any], Any], workers: int = 2) -> tuple[Gateway, set[int]]:
    """A replica stub and a gateway of `workers` workers, once every worker answers; with the workers' pids."""
    stub = track(start_stub("r0"))
    gateway: Gateway = track(
        start_gateway(
            tmp_path, {MODEL: pool(("r0", stub.url))}, flags=["--workers", str(workers)], shutdown={"grace_s": GRACE_S}
        )
    )
    eventually(lambda: _all_up(gateway.url, workers), timeout_s=30, interval_s=0.2)
    pids = _children(gateway.proc.popen.pid)
    assert len(pids) == workers
    return gateway, pids


def test_two_workers_answer_every_request_and_merge_their_metrics(tmp_path: Path) -> None:
    with running() as track:
        gateway, _ = _start(tmp_path, track)
        statuses = [_completion(gateway.url) for _ in range(40)]
        assert statuses == [200] * 40
        requests, up = _per_worker(gateway.url)
        assert up == {"0": 1.0, "1": 1.0}
        assert sum(requests.values()) == 40  # any worker's /metrics counts both workers' requests
        assert requests.get("0", 0) > 0 and requests.get("1", 0) > 0, requests


def test_a_killed_worker_is_restarted_and_traffic_keeps_succeeding(tmp_path: Path) -> None:
    with running() as track:
        gateway, before = _start(tmp_path, track)
        supervisor = gateway.proc.popen.pid
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        eventually(lambda: victim not in _children(supervisor), timeout_s=5)
        assert [_completion(gateway.url) for _ in range(20)] == [200] * 20  # the survivor takes it all
        eventually(lambda: len(_children(supervisor)) == 2 and _all_up(gateway.url), timeout_s=30, interval_s=0.2)
        assert victim not in _children(supervisor)
        before_requests = _per_worker(gateway.url)[0]
        assert [_completion(gateway.url) for _ in range(40)] == [200] * 40
        after = _per_worker(gateway.url)[0]
        assert all(after.get(w, 0) > before_requests.get(w, 0) for w in ("0", "1")), (before_requests, after)
        assert '"event":"worker_restarting"' in gateway.proc.output()


def test_a_worker_crash_loop_makes_the_supervisor_exit_1(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as holder:  # no SO_REUSEPORT: every worker's bind fails
        holder.bind(("127.0.0.1", port))
        holder.listen()
        path = tmp_path / "gateway.yaml"
        path.write_text(
            yaml.safe_dump(
                {"listen": {"host": "127.0.0.1", "port": port}, "pools": {MODEL: pool(("r0", "http://127.0.0.1:9"))}}
            )
        )
        proc = Proc(python_module("gateway", "serve", "--config", str(path), "--workers", "2"))
        try:
            assert proc.popen.wait(60) == 1
        finally:
            proc.stop()
    output = proc.output()
    assert '"event":"workers_crash_loop"' in output and '"level":"error"' in output, output[-3000:]


def test_sigterm_stops_every_worker_within_the_grace(tmp_path: Path) -> None:
    with running() as track:
        gateway, workers = _start(tmp_path, track)
        started = time.monotonic()
        gateway.proc.popen.send_signal(signal.SIGTERM)
        assert gateway.proc.popen.wait(GRACE_S + 5) == 0
        elapsed = time.monotonic() - started
        assert all(not Path(f"/proc/{pid}").exists() for pid in workers)
        assert elapsed < GRACE_S + 1, elapsed
        assert '"event":"workers_stopped"' in gateway.proc.output()
