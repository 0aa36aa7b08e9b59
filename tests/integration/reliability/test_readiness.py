"""`/ready` per pool over real processes: one empty pool of two keeps the gateway in its Service."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import free_port
from tests.integration.gateway_procs import MODEL, pool, running, start_gateway, start_stub

pytestmark = pytest.mark.timeout(60)
DEAD = "dead-model"


def _until_empty(url: str) -> dict[str, object]:
    deadline = time.monotonic() + 10
    while True:
        body = httpx.get(f"{url}/ready", timeout=5).json()
        if body["available_replicas"][DEAD] == 0 or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def test_one_empty_pool_of_two_is_ready_and_named(tmp_path: Path) -> None:
    with running() as track:
        stub = track(start_stub("live-0"))
        pools = {MODEL: pool(("live-0", stub.url)), DEAD: pool(("dead-0", f"http://127.0.0.1:{free_port()}"))}
        gateway = track(start_gateway(tmp_path, pools))
        body = _until_empty(gateway.url)
        with httpx.Client(base_url=gateway.url, timeout=5) as http:
            answer = http.get("/ready")
            assert answer.status_code == 200 and body["ready"] is True
            assert answer.json()["empty_pools"] == [DEAD]
            assert answer.json()["available_replicas"] == {MODEL: 1, DEAD: 0}
            one = http.get("/ready", params={"model": DEAD})
            assert one.status_code == 503 and one.json()["available_replicas"] == {DEAD: 0}
            assert http.get("/ready", params={"model": MODEL}).status_code == 200
            unknown = http.get("/ready", params={"model": "nope"})
            assert unknown.status_code == 404
            assert unknown.json()["error"]["type"] == "NotFoundError" and unknown.json()["error"]["code"] == 404
            gateway.rewrite({**gateway.data, "readiness": {"require_all_pools": True}})
            assert http.post("/admin/reload").status_code == 200
            strict = http.get("/ready")
            assert strict.status_code == 503 and strict.json()["empty_pools"] == [DEAD]
