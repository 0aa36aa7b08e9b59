"""The compose topology as processes on loopback: `affinity-gateway up --gateways 2 --redis` starts
Redis, three replica stubs and two gateways; a conversation whose turns alternate between the two
gateways stays on one replica, because both gateways read the same warm-prefix tables in Redis."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import redis

from tests.helpers import Proc, must_run_redis, python_module, redis_server_binary, wait_http

pytestmark = [pytest.mark.redis, pytest.mark.slow]

SYSTEM = (
    "You are the support assistant of a company that sells garden tools. Answer briefly, politely and "
    "only about our products, delivery and returns. "
) * 12


def question(conversation: int, turn: int) -> str:
    """A turn with a pasted order history: a conversation's own history soon outweighs a tie (the
    policy lets the shared system prompt attract nothing, and a few tokens of history little)."""
    orders = " ".join(
        f"order {conversation}-{turn}-{i}: {i + 2} rakes, {i + 1} hoses, shipped {i + 3} May;" for i in range(12)
    )
    return f"Conversation {conversation}, question {turn}: my last orders were {orders} which one is late?"


def free_port_pair() -> int:
    """A port p with p and p+1 both free (the gateways listen on --port and --port+1)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no two consecutive free ports")


@dataclass
class Cluster:
    urls: list[str]  # the two gateways
    store: str  # the redis:// URL of the redis-server `up` started


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if redis_server_binary() is None:
        if must_run_redis():
            pytest.fail("redis-server not found and CI=true")
        pytest.skip("redis-server not installed")
    port = free_port_pair()
    proc = Proc(
        python_module(
            "gateway",
            "up",
            "--replicas",
            "3",
            "--gateways",
            "2",
            "--redis",
            "--port",
            str(port),
            "--policy",
            "prefix_affinity",
            "--speedup",
            "50",
            "--log-level",
            "warning",
        )
    )
    urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
    try:
        for url in urls:
            wait_http(f"{url}/ready", proc, timeout=60)
        deadline = time.monotonic() + 10  # the banner follows once `up` has seen both gateways answer
        while not (store := re.search(r"they share (redis://127\.0\.0\.1:\d+/0)", proc.output())):
            assert time.monotonic() < deadline and proc.alive(), proc.output()[-2000:]
            time.sleep(0.05)
        yield Cluster(urls, store.group(1))
    finally:
        proc.stop(timeout=20)


def test_up_runs_three_replicas_behind_two_gateways(cluster: Cluster) -> None:
    for url in cluster.urls:
        replicas = httpx.get(f"{url}/admin/replicas", timeout=5).json()["stub-model"]["replicas"]
        assert sorted(r["id"] for r in replicas) == ["replica-0", "replica-1", "replica-2"]


def test_conversation_sticks_to_one_replica_whichever_gateway_serves_it(cluster: Cluster) -> None:
    urls = cluster.urls
    for conversation in range(3):
        messages = [{"role": "system", "content": SYSTEM}]
        served: list[tuple[str, str]] = []
        cached: list[int] = []
        for turn in range(4):
            gateway = urls[turn % 2]  # alternate gateways, as a round-robin front would
            messages.append({"role": "user", "content": question(conversation, turn)})
            answer = httpx.post(
                f"{gateway}/v1/chat/completions",
                timeout=30,
                json={"model": "stub-model", "messages": messages, "max_tokens": 24, "temperature": 0},
            )
            assert answer.status_code == 200, answer.text
            body = answer.json()
            served.append((gateway, answer.headers["X-Replica-Id"]))
            cached.append(body["usage"].get("prompt_tokens_details", {}).get("cached_tokens") or 0)
            messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
            time.sleep(0.05)  # let the serving gateway's write reach Redis before the other reads
        assert {gateway for gateway, _ in served} == set(urls)
        assert len({replica for _, replica in served}) == 1, served
        assert all(c > 0 for c in cached[1:]), cached  # the replica really held the earlier turns
    tables = redis.Redis.from_url(cluster.store, decode_responses=True).keys("affinity:stub-model:blocks:*")
    assert tables and {str(t).rsplit(":", 1)[1] for t in tables} <= {"replica-0", "replica-1", "replica-2"}
