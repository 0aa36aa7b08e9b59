"""A real stub process publishing vLLM KV events, read by a ZMQ subscriber as a router would."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import msgpack
import pytest
import zmq

from tests.helpers import free_port
from tests.integration.gateway_procs import MODEL, Stub, start_stub

pytestmark = pytest.mark.timeout(20)
BLOCK = 16
NUM_BLOCKS = 32  # 512 tokens: a few distinct prompts force evictions


@dataclass
class Replica:
    stub: Stub
    sub: zmq.Socket
    replay_endpoint: str

    def chat(self, text: str) -> dict[str, Any]:
        body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 2}
        response = httpx.post(f"{self.stub.url}/v1/chat/completions", json=body, timeout=10)
        assert response.status_code == 200, response.text
        return response.json()

    def reset(self) -> httpx.Response:
        return httpx.post(f"{self.stub.url}/reset_prefix_cache", timeout=5)

    def batches(self, quiet_ms: int = 200) -> list[tuple[int, list[Any]]]:
        """Every batch received until none arrives for `quiet_ms`: (seq, events)."""
        received = []
        while self.sub.poll(quiet_ms):
            topic, seq, payload = self.sub.recv_multipart()
            assert topic == b"kv"
            ts, events, rank = msgpack.unpackb(payload, raw=False)
            assert isinstance(ts, float) and rank is None
            received.append((int.from_bytes(seq, "big"), events))
        return received


@pytest.fixture(scope="module")
def replica() -> Iterator[Replica]:
    endpoint, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    stub = start_stub(
        "kv-events",
        MODEL,
        50,
        "--num-gpu-blocks",
        str(NUM_BLOCKS),
        "--kv-events-endpoint",
        endpoint,
        "--kv-events-replay-endpoint",
        replay,
        "--kv-events-topic",
        "kv",
    )
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    replica = Replica(stub, sub, replay)
    try:
        while not sub.poll(50):  # slow joiner: an idle reset publishes AllBlocksCleared until we hear one
            assert replica.reset().status_code == 200
        replica.batches()
        yield replica
    finally:
        sub.close(linger=0)
        ctx.term()
        stub.stop()


def _events(batches: list[tuple[int, list[Any]]], kind: str) -> list[list[Any]]:
    return [event for _, events in batches for event in events if event[0] == kind]


def test_prompt_blocks_are_stored_as_a_chain_then_evicted(replica: Replica) -> None:
    text = " ".join(f"first{i}" for i in range(100))
    prompt_ids = httpx.post(
        f"{replica.stub.url}/tokenize",
        timeout=5,
        json={"model": MODEL, "messages": [{"role": "user", "content": text}]},
    ).json()["tokens"]
    replica.chat(text)
    stored = _events(replica.batches(), "BlockStored")
    _, prompt_hashes, parent, token_ids, block_size, lora_id, medium = stored[0]
    assert parent is None and block_size == BLOCK and lora_id is None and medium == "GPU"
    num_full = len(prompt_ids) // BLOCK
    assert len(prompt_hashes) == num_full and token_ids == prompt_ids[: num_full * BLOCK]

    for n in range(6):  # ~7 blocks each: more than the pool holds
        replica.chat(" ".join(f"other{n}-{i}" for i in range(100)))
    batches = replica.batches()
    seen = {h for event in stored for h in event[1]}
    for _, hashes, parent, token_ids, block_size, *_ in _events(batches, "BlockStored"):
        assert parent is None or parent in seen
        assert len(token_ids) == block_size * len(hashes)
        seen.update(hashes)
    removed = [h for event in _events(batches, "BlockRemoved") for h in event[1]]
    assert set(removed) <= seen and set(prompt_hashes) & set(removed)  # the oldest prompt went first


def test_replay_from_zero_returns_every_batch_then_the_end_marker(replica: Replica) -> None:
    replica.chat("replay me please " * 20)
    live = dict(replica.batches())
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(replica.replay_endpoint)
    try:
        dealer.send((0).to_bytes(8, "big"))
        replies = []
        while not replies or replies[-1][0] != -1:
            assert dealer.poll(5000)
            seq, payload = dealer.recv_multipart()
            replies.append((int.from_bytes(seq, "big", signed=True), payload))
    finally:
        dealer.close(linger=0)
    assert [seq for seq, _ in replies] == [*range(max(live) + 1), -1] and replies[-1][1] == b""
    assert all(msgpack.unpackb(payload, raw=False)[1] == live[seq] for seq, payload in replies if seq in live)


def test_reset_prefix_cache_publishes_all_blocks_cleared(replica: Replica) -> None:
    text = "cache me and then forget me " * 10
    replica.chat(text)
    replica.batches()
    deadline = time.monotonic() + 5
    while (response := replica.reset()).status_code == 409:  # the last request may still hold its blocks
        assert time.monotonic() < deadline, response.text
        time.sleep(0.02)
    assert response.status_code == 200
    assert [events for _, events in replica.batches()] == [[["AllBlocksCleared"]]]
    again = replica.chat(text)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert _events(replica.batches(), "BlockStored")
