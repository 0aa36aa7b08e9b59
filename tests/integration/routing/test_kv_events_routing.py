"""Exact cache state over real processes: a replica stub publishing KV events, a gateway subscribing.

The gateway's table for the replica must equal the stub's cache after requests and evictions, a
batch lost on the wire must come back through the replay socket, and a restarted stub (its
sequence back at 0) must reset the table. Predictions on the exact rung must equal what the
replica then reports as cached.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.helpers import free_port
from tests.integration.gateway_procs import MODEL, Gateway, Stub, running, start_gateway
from tests.integration.reliability_tools import eventually

pytestmark = pytest.mark.timeout(60)
NUM_BLOCKS = 64  # 1024 tokens: four of the prompts below (~18 blocks each) do not fit together
T = TypeVar("T")
SYSTEM = "You answer questions about the history of maps and navigation, briefly. "


def prompt(tag: str, words: int = 280) -> list[dict[str, str]]:
    text = " ".join(f"{tag}{i}" for i in range(words))
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


@dataclass
class Replica:
    stub: Stub
    events: str
    replay: str


def start_replica(
    name: str = "replica-0", port: int | None = None, events: str | None = None, replay: str | None = None
) -> Replica:
    events = events or f"tcp://127.0.0.1:{free_port()}"
    replay = replay or f"tcp://127.0.0.1:{free_port()}"
    stub = Stub(name, port or free_port(), MODEL, 50).start(
        "--num-gpu-blocks", str(NUM_BLOCKS), "--kv-events-endpoint", events, "--kv-events-replay-endpoint", replay
    )
    return Replica(stub, events, replay)


def gateway_for(
    tmp_path: Path,
    replica: Replica,
    events_endpoint: str | None = None,
    subscribe: bool = True,
    tokenizer: str = "sim",
    **sections: Any,
) -> Gateway:
    entry: dict[str, Any] = {"url": replica.stub.url, "name": replica.stub.replica_id}
    if subscribe:
        entry["kv_events"] = {"endpoint": events_endpoint or replica.events, "replay_endpoint": replica.replay}
    pool = {
        "replicas": [entry],
        "routing": {"policy": "prefix_affinity", "prefix": {"tokenizer": tokenizer, "block_tokens": 16}},
    }
    return start_gateway(tmp_path, {MODEL: pool}, **sections)


def feed(gateway: Gateway, replica: Replica) -> dict[str, Any]:
    return gateway.replicas()[replica.stub.replica_id]["kv_events"]


def stub_cache(replica: Replica) -> dict[str, Any]:
    return httpx.get(f"{replica.stub.url}/debug/kv_cache", timeout=5).json()


def mirrors(gateway: Gateway, replica: Replica) -> bool:
    state = feed(gateway, replica)
    return state["certain"] and state["blocks"] == stub_cache(replica)["cached_blocks"]


def chat(url: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 4}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=20)
    assert answer.status_code == 200, answer.text
    return answer.json()


@contextmanager
def replica_and_gateway(tmp_path: Path, tokenizer: str = "sim") -> Iterator[tuple[Callable[[T], T], Replica, Gateway]]:
    """One publishing stub and one gateway subscribing to it; `track` stops whatever else the test starts."""
    with running() as track:
        replica = start_replica()
        track(replica.stub)
        yield track, replica, track(gateway_for(tmp_path, replica, tokenizer=tokenizer))


def warm(gateway: Gateway, replica: Replica, messages: list[dict[str, str]]) -> None:
    """Once the feed is in sync, one request through the gateway, then wait until the tables agree."""
    eventually(lambda: feed(gateway, replica)["certain"], timeout_s=10)
    chat(gateway.url, messages)
    eventually(lambda: mirrors(gateway, replica), timeout_s=5)


def predicted(gateway: Gateway, messages: list[dict[str, str]]) -> tuple[int, str]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 4}
    explained = httpx.post(f"{gateway.url}/admin/route/explain", json=body, timeout=10).json()
    row = explained["candidates"][0]
    return row["cached_tokens"], explained["evidence"][row["replica"]]


@pytest.mark.parametrize("tokenizer", ["sim", "replica"])  # local files, or the replica's own /tokenize
def test_gateway_table_mirrors_the_stub_cache_through_hits_and_evictions(tmp_path: Path, tokenizer: str) -> None:
    with replica_and_gateway(tmp_path, tokenizer) as (_, replica, gateway):
        first = prompt("alpha")
        warm(gateway, replica, first)
        assert feed(gateway, replica)["blocks"] > 15
        expected, evidence = predicted(gateway, first)
        assert evidence == "events" and expected >= 15 * 16
        assert chat(gateway.url, first)["usage"]["prompt_tokens_details"]["cached_tokens"] == expected
        for tag in ("beta", "gamma", "delta"):  # 64 blocks hold three prompts at most: alpha is evicted
            chat(gateway.url, prompt(tag))
        eventually(lambda: mirrors(gateway, replica), timeout_s=5)
        expected, evidence = predicted(gateway, first)
        assert evidence == "events"
        assert chat(gateway.url, first)["usage"]["prompt_tokens_details"]["cached_tokens"] == expected
        metrics = httpx.get(f"{gateway.url}/metrics", timeout=5).text
        assert 'affinity_gateway_kv_events_certain{model_name="stub-model",replica="replica-0"} 1.0' in metrics
        assert 'affinity_gateway_route_evidence_total{evidence="events",model_name="stub-model"}' in metrics


class Cuttable:
    """A TCP relay between the gateway's subscriber and the stub's PUB socket that the test can cut:
    batches published while it is cut are lost on the wire, as in a network partition."""

    def __init__(self, target_port: int) -> None:
        self.port, self.target_port = free_port(), target_port
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._conns: list[socket.socket] = []
        self._open = threading.Event()
        self._open.set()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._open.is_set():
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        src.close()  # each socket is the source of exactly one pipe: closed once, by its reader

    @contextmanager
    def cut(self) -> Iterator[None]:
        self._open.clear()
        for conn in self._conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._conns.clear()
        try:
            yield
        finally:
            self._open.set()

    def close(self) -> None:
        self._listener.close()
        for conn in self._conns:
            conn.close()


def test_batches_lost_on_the_wire_come_back_through_replay(tmp_path: Path) -> None:
    with running() as track:
        replica = start_replica()
        track(replica.stub)
        relay = Cuttable(int(replica.events.rsplit(":", 1)[1]))
        gateway = track(gateway_for(tmp_path, replica, relay.endpoint))
        warm(gateway, replica, prompt("one"))
        with relay.cut():
            for tag in ("two", "three"):  # straight to the stub: the gateway misses these batches
                chat(replica.stub.url, prompt(tag))
        # The next batch after the reconnect skips ahead: the subscriber asks the replay socket.
        eventually(
            lambda: (chat(replica.stub.url, prompt("four", 10)), feed(gateway, replica)["replays"] >= 2)[1],
            timeout_s=10,
            interval_s=0.3,
        )
        eventually(lambda: mirrors(gateway, replica), timeout_s=5)
        state = feed(gateway, replica)
        assert state["gaps"] >= 1 and state["resets"] == 0
        expected, evidence = predicted(gateway, prompt("three"))
        assert evidence == "events" and expected > 0
        assert chat(gateway.url, prompt("three"))["usage"]["prompt_tokens_details"]["cached_tokens"] == expected
        relay.close()


def test_a_restarted_stub_resets_the_table(tmp_path: Path) -> None:
    with replica_and_gateway(tmp_path) as (track, replica, gateway):
        warm(gateway, replica, prompt("before"))
        replica.stub.stop()
        again = track(start_replica(port=replica.stub.port, events=replica.events, replay=replica.replay).stub)
        assert again.port == replica.stub.port
        eventually(lambda: gateway.replicas()[replica.stub.replica_id]["available"], timeout_s=10)
        chat(gateway.url, prompt("after"))  # seq 0 of the new process: the old table is dropped
        eventually(lambda: mirrors(gateway, replica), timeout_s=5)
        assert feed(gateway, replica)["resets"] >= 1
        expected, evidence = predicted(gateway, prompt("before"))  # only what "after" shares: the system prompt
        assert evidence == "events" and expected < 3 * 16
        assert chat(gateway.url, prompt("before"))["usage"]["prompt_tokens_details"]["cached_tokens"] == expected


@pytest.mark.redis
def test_with_redis_what_the_events_say_reaches_gateways_without_a_feed(tmp_path: Path, redis_url: str) -> None:
    shared = {"redis": {"url": redis_url, "key_prefix": f"kv-events-{free_port()}:"}, "index": {"store": "redis"}}
    with running() as track:
        replica = start_replica()
        track(replica.stub)
        subscribed = track(gateway_for(tmp_path, replica, **shared))
        unsubscribed = track(gateway_for(tmp_path, replica, subscribe=False, **shared))
        eventually(lambda: feed(subscribed, replica)["certain"], timeout_s=10)
        messages = prompt("direct")
        chat(replica.stub.url, messages)  # straight to the replica: no gateway routed it
        eventually(lambda: mirrors(subscribed, replica), timeout_s=5)
        eventually(lambda: predicted(unsubscribed, messages)[0] > 0, timeout_s=5)
        expected, evidence = predicted(unsubscribed, messages)
        assert evidence == "history"
        assert chat(unsubscribed.url, messages)["usage"]["prompt_tokens_details"]["cached_tokens"] == expected


def test_a_reload_that_drops_the_feed_closes_it_and_routes_from_history(tmp_path: Path) -> None:
    with replica_and_gateway(tmp_path) as (_, replica, gateway):
        warm(gateway, replica, prompt("kept"))
        data = gateway.data
        del data["pools"][MODEL]["replicas"][0]["kv_events"]
        gateway.rewrite(data)
        assert httpx.post(f"{gateway.url}/admin/reload", timeout=10).status_code == 200
        assert "kv_events" not in gateway.replicas()[replica.stub.replica_id]
        assert "affinity_gateway_kv_events_certain{" not in httpx.get(f"{gateway.url}/metrics", timeout=5).text
        expected, evidence = predicted(gateway, prompt("kept"))
        assert evidence == "history"  # a new router (its routing section changed): its own history from now on
        assert chat(gateway.url, prompt("kept"))["usage"]["prompt_tokens_details"]["cached_tokens"] >= expected


def test_two_gateways_without_redis_converge_on_the_same_table(tmp_path: Path) -> None:
    with replica_and_gateway(tmp_path) as (track, replica, first):
        second = track(gateway_for(tmp_path, replica))
        warm(first, replica, prompt("shared"))  # routed by the first gateway only
        eventually(lambda: mirrors(second, replica), timeout_s=5)
        assert predicted(second, prompt("shared")) == predicted(first, prompt("shared"))
        assert predicted(second, prompt("shared"))[1] == "events"
