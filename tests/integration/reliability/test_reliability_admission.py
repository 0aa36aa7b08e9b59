"""Overload and abuse over real processes: floods get 429s (never 5xx or timeouts), per-replica caps
hold, slow clients are cut off by deadlines, oversized input is refused, API keys are enforced and
never logged, and prompt text is logged only when enabled."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections import Counter
from pathlib import Path

import aiohttp
import httpx
import pytest

from gateway.edge.auth import hash_key
from tests.integration.gateway_procs import MODEL, pool, running, start_gateway, start_stub
from tests.integration.reliability_tools import Load, chat, eventually, replica_running, report

pytestmark = pytest.mark.timeout(60)
CAP, QUEUE, FLOOD = 3, 6, 40


def test_flood_past_capacity_gets_429_with_retry_after(tmp_path: Path) -> None:
    with running() as track:
        stub = track(start_stub("only", speedup=2))
        gateway = track(
            start_gateway(
                tmp_path,
                {MODEL: pool(("only", stub.url))},
                admission={
                    "max_in_flight_per_replica": CAP,
                    "max_queue": QUEUE,
                    "queue_timeout_s": 20.0,
                    "retry_after_s": 2.0,
                },
                limits={"max_messages": 16, "max_prompt_tokens": 1000},
            )
        )
        load = Load(gateway.url, timeout_s=30)
        peak = 0

        async def flood() -> None:
            nonlocal peak
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                tasks = [asyncio.create_task(load.one(session, chat(f"q{i}", max_tokens=30))) for i in range(FLOOD)]
                async with httpx.AsyncClient(timeout=5) as http:
                    while not all(t.done() for t in tasks):
                        peak = max(
                            peak,
                            (await http.get(f"{gateway.url}/admin/replicas")).json()[MODEL]["replicas"][0]["in_flight"],
                        )
                        await asyncio.sleep(0.01)

        asyncio.run(flood())
        statuses = Counter(o.status for o in load.outcomes)
        report("flood past capacity", load.outcomes, answered_200=statuses[200], answered_429=statuses[429])
        assert statuses == {200: CAP + QUEUE, 429: FLOOD - CAP - QUEUE}, statuses
        assert all(o.clean for o in load.outcomes if o.status == 200)
        rejected = [o for o in load.outcomes if o.status == 429]
        assert all(b'"code":429' in o.body for o in rejected)
        assert peak == CAP and replica_running(stub) == 0
        with httpx.Client(base_url=gateway.url, timeout=5) as http:
            over = http.get("/metrics").text
            rejected = f'affinity_gateway_rejected_total{{model_name="{MODEL}",reason="queue"}}'
            assert f"{rejected} {FLOOD - CAP - QUEUE}.0" in over
            many = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user"}] * 50})
            assert many.status_code == 400 and many.json()["error"]["param"] == "messages"
            long = http.post("/v1/chat/completions", json=chat("word " * 5000))
            assert long.status_code == 400 and "over the limit" in long.json()["error"]["message"]


def test_queue_full_answer_carries_retry_after(tmp_path: Path) -> None:
    with running() as track:
        stub = track(start_stub("only", speedup=1))
        gateway = track(
            start_gateway(
                tmp_path,
                {MODEL: pool(("only", stub.url))},
                admission={"max_in_flight_per_replica": 1, "max_queue": 0, "retry_after_s": 3.0},
            )
        )
        with httpx.Client(base_url=gateway.url, timeout=10) as http:
            with http.stream("POST", "/v1/chat/completions", json=chat(max_tokens=200, stream=True)) as busy:
                chunks = busy.iter_raw()  # keep the iterator: dropping it closes the stream
                assert next(chunks).startswith(b"data: ")
                refused = http.post("/v1/chat/completions", json=chat())
            assert refused.status_code == 429 and refused.headers["Retry-After"] == "3"


def test_slow_clients_hit_deadlines(tmp_path: Path) -> None:
    with running() as track:
        stub = track(start_stub("only"))
        gateway = track(
            start_gateway(
                tmp_path,
                {MODEL: pool(("only", stub.url))},
                limits={"client_header_timeout_s": 1.0, "client_body_timeout_s": 0.5, "max_header_bytes": 2048},
            )
        )
        # slowloris: headers a byte at a time; the connection is closed at the header deadline
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
            sock.settimeout(5)
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n")
            started, closed = time.monotonic(), False
            while time.monotonic() - started < 4:
                try:
                    sock.sendall(b"X")
                except OSError:
                    closed = True
                    break
                time.sleep(0.1)
            closed = closed or sock.recv(1024) == b""
            assert closed and time.monotonic() - started < 2.5
        # slow body: headers promise 100 bytes, 10 arrive
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
            sock.settimeout(5)
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"model":'
            )
            answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 408") and b'"code":408' in answer
        with httpx.Client(base_url=gateway.url, timeout=5) as http:
            huge = http.post("/v1/chat/completions", json=chat(), headers={"X-Big": "x" * 4096})
            assert 400 <= huge.status_code < 500
            assert http.post("/v1/chat/completions", json=chat()).status_code == 200, "still serving"


ADMIN_KEY, USER_KEY = "sk-admin-0123456789", "sk-user-abcdefghij"
SECRET_PROMPT = "the-secret-prompt-text-42"


def test_api_keys_tenants_rate_limits_and_logs(tmp_path: Path) -> None:
    keys = [
        {"sha256": hash_key(ADMIN_KEY), "tenant": "ops", "admin": True},
        {"sha256": hash_key(USER_KEY), "tenant": "acme", "requests_per_minute": 4},
    ]
    with running() as track:
        stub = track(start_stub("only"))
        gateway = track(start_gateway(tmp_path, {MODEL: pool(("only", stub.url))}, auth={"keys": keys}))
        user = {"Authorization": f"Bearer {USER_KEY}"}
        with httpx.Client(base_url=gateway.url, timeout=10) as http:
            assert http.get("/health").status_code == 200 and http.get("/ready").status_code == 200
            assert http.post("/v1/chat/completions", json=chat(SECRET_PROMPT)).status_code == 401
            wrong = http.post("/v1/chat/completions", json=chat(), headers={"Authorization": "Bearer sk-nope"})
            assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "AuthenticationError"
            assert http.get("/admin/replicas", headers=user).status_code == 403
            assert http.get("/admin/replicas", headers={"X-API-Key": ADMIN_KEY}).status_code == 200
            statuses = [
                http.post("/v1/chat/completions", json=chat(SECRET_PROMPT), headers=user).status_code for _ in range(6)
            ]
            assert statuses == [200] * 4 + [429] * 2, "4 requests in any minute, the first 4 at once"
            metrics = http.get("/metrics").text
            assert 'affinity_gateway_tenant_requests_total{status="200",tenant="acme"} 4.0' in metrics
            assert 'affinity_gateway_tenant_requests_total{status="429",tenant="acme"} 2.0' in metrics
        log = gateway.proc.output()
        assert '"tenant":"acme"' in log
        assert USER_KEY not in log and ADMIN_KEY not in log and SECRET_PROMPT not in log

        data = {**gateway.data, "logging": {"prompts": True}, "auth": {"keys": keys[:1]}}
        gateway.rewrite(data)
        gateway.proc.popen.send_signal(signal.SIGHUP)
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        with httpx.Client(base_url=gateway.url, timeout=10) as http:
            eventually(lambda: http.post("/v1/chat/completions", json=chat(), headers=user).status_code == 401)
            assert http.post("/v1/chat/completions", json=chat(SECRET_PROMPT), headers=admin).status_code == 200
        eventually(lambda: SECRET_PROMPT in gateway.proc.output(), timeout_s=5)
        assert ADMIN_KEY not in gateway.proc.output()
