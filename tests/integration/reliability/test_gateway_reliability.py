"""Failure paths over real processes: replica death and return, client disconnect, reload, bad config."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.helpers import free_port, python_module
from tests.integration.gateway_procs import MODEL, pool, running, start_gateway, start_stub

COMPLETION = {"model": MODEL, "prompt": "x", "max_tokens": 1}


def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_killed_replica_is_skipped_then_comes_back(tmp_path: Path) -> None:
    with running() as track:
        stubs = [track(start_stub(f"replica-{i}")) for i in range(3)]
        gateway = track(start_gateway(tmp_path, {MODEL: pool(*((s.replica_id, s.url) for s in stubs))}))
        stubs[1].proc.kill()  # type: ignore[union-attr]
        with httpx.Client(base_url=gateway.url, timeout=10) as http:
            statuses = Counter(http.post("/v1/completions", json=COMPLETION).status_code for _ in range(12))
            assert statuses == {200: 12}, "requests that hit the dead replica are retried elsewhere"
            eventually(lambda: not gateway.replicas()["replica-1"]["available"])
            seen = Counter(http.post("/v1/completions", json=COMPLETION).headers["X-Replica-Id"] for _ in range(10))
            assert seen.keys() == {"replica-0", "replica-2"} and abs(seen["replica-0"] - seen["replica-2"]) <= 2
            stubs[1].start()
            eventually(lambda: gateway.replicas()["replica-1"]["available"])
            seen = Counter(http.post("/v1/completions", json=COMPLETION).headers["X-Replica-Id"] for _ in range(9))
            assert 2 <= seen["replica-1"] <= 4


def test_in_flight_returns_to_zero_after_client_disconnect(tmp_path: Path) -> None:
    with running() as track:
        stub = track(start_stub("slow", speedup=1))
        gateway = track(start_gateway(tmp_path, {MODEL: pool(("slow", stub.url))}))
        body = {**COMPLETION, "max_tokens": 400, "stream": True}
        with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, timeout=10) as resp:
            chunks = resp.iter_raw()  # keep the iterator: dropping it closes the stream
            assert next(chunks).startswith(b"data: ")
            assert gateway.replicas()["slow"]["in_flight"] == 1
        eventually(lambda: gateway.replicas()["slow"]["in_flight"] == 0, timeout_s=3)
        eventually(lambda: gateway.replicas()["slow"]["running"] == 0, timeout_s=3)  # the replica aborted it too


def test_reload_swaps_policy_without_dropping_in_flight_requests(tmp_path: Path) -> None:
    results: list[tuple[int, bytes]] = []

    def long_stream(url: str) -> None:
        body = {**COMPLETION, "max_tokens": 200, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=20) as resp:
            results.append((resp.status_code, resp.read()))

    with running() as track:
        stubs = [track(start_stub(f"replica-{i}", speedup=4)) for i in range(2)]
        gateway = track(start_gateway(tmp_path, {MODEL: pool(*((s.replica_id, s.url) for s in stubs))}))
        threads = [threading.Thread(target=long_stream, args=(gateway.url,)) for _ in range(4)]
        for t in threads:
            t.start()
        eventually(lambda: sum(r["in_flight"] for r in gateway.replicas().values()) == 4)
        data = {**gateway.data, "pools": {MODEL: pool(*((s.replica_id, s.url) for s in stubs), policy="least_loaded")}}
        gateway.rewrite(data)
        gateway.proc.popen.send_signal(signal.SIGHUP)
        eventually(lambda: httpx.get(f"{gateway.url}/admin/replicas").json()[MODEL]["policy"] == "least_loaded")
        assert sum(r["in_flight"] for r in gateway.replicas().values()) == 4, "reload finished before the streams"
        for t in threads:
            t.join(20)
        assert [status for status, _ in results] == [200] * 4
        assert all(body.endswith(b"data: [DONE]\n\n") for _, body in results)

        data["pools"][MODEL]["routing"] = {"policy": "least_loaded", "params": {"seeed": 1}}
        gateway.rewrite(data)
        answer = httpx.post(f"{gateway.url}/admin/reload")
        assert answer.status_code == 400 and answer.json()["error"]["param"] == f"pools.{MODEL}.routing.params.seeed"
        assert httpx.post(f"{gateway.url}/v1/completions", json=COMPLETION).status_code == 200


def test_serve_refuses_a_bad_config_naming_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("pools:\n  m:\n    replicas: [{url: 'http://127.0.0.1:1'}]\ntimeouts: {idle_s: -1}\n")
    done = subprocess.run(
        python_module("gateway", "serve", "--config", str(path)), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert f"{path}:timeouts.idle_s: must be > 0" in done.stderr


def test_error_statuses_over_real_processes(tmp_path: Path) -> None:
    with running() as track:
        stub = track(start_stub("slow", speedup=1))
        dead = f"http://127.0.0.1:{free_port()}"
        pools = {MODEL: pool(("slow", stub.url)), "dead-model": pool(("dead", dead))}
        gateway = track(
            start_gateway(
                tmp_path, pools, limits={"max_body_bytes": 2000}, timeouts={"connect_s": 1.0, "first_byte_s": 0.3}
            )
        )
        with httpx.Client(base_url=gateway.url, timeout=10) as http:
            too_big = http.post("/v1/completions", json={**COMPLETION, "prompt": "x" * 3000})
            assert too_big.status_code == 413 and too_big.json()["error"]["code"] == 413
            slow = http.post("/v1/completions", json={**COMPLETION, "max_tokens": 200})
            assert slow.status_code == 504 and slow.json()["error"]["type"] == "GatewayTimeoutError"
            eventually(lambda: not gateway.replicas("dead-model")["dead"]["available"])
            down = http.post("/v1/completions", json={**COMPLETION, "model": "dead-model"})
            assert down.status_code == 503 and down.headers["Retry-After"] == "1"
            assert http.get("/ready", params={"model": "dead-model"}).status_code == 503  # (test_readiness.py)
