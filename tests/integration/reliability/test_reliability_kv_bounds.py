"""A KV-event publisher that names more blocks than its replica holds, through a real gateway process.

The replica (the stub, `--num-gpu-blocks 64`) says its KV capacity in `vllm:cache_config_info`; its KV
events come from a publisher in the test (a ZMQ PUB on loopback) that names 200,000 blocks in 20 batches
and never removes one. The gateway's exact table for the replica must stay at 64 blocks (before: it kept
every block named: the issue's 1.4 M cost 340-360 MB) and the gateway serves on.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
import zmq

from tests.helpers import free_port
from tests.integration.gateway_procs import MODEL, Gateway, running, start_gateway, start_stub
from tests.integration.reliability_tools import chat, eventually, report

pytestmark = pytest.mark.timeout(90)

BLOCK, CAPACITY, PER_BATCH, BATCHES = 16, 64, 10_000, 20


def _rss_kb(gateway: Gateway) -> int:
    status = Path(f"/proc/{gateway.proc.popen.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def _batch(first: int, count: int, parent: int | None) -> bytes:
    hashes = list(range(first, first + count))
    event = ["BlockStored", hashes, parent, list(range(BLOCK * count)), BLOCK, None, "GPU"]
    payload: bytes = msgpack.packb([time.time(), [event], None])
    return payload


def test_a_table_stays_at_the_replica_s_capacity(tmp_path: Path) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(endpoint)
    seq = 0

    def publish(payload: bytes) -> None:
        nonlocal seq
        pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
        seq += 1

    try:
        with running() as track:
            stub = track(start_stub("liar", MODEL, 50, "--num-gpu-blocks", str(CAPACITY)))
            entry: dict[str, Any] = {"url": stub.url, "name": "liar", "kv_events": {"endpoint": endpoint}}
            routing = {"policy": "prefix_affinity", "prefix": {"tokenizer": "sim", "block_tokens": BLOCK}}
            gateway = track(start_gateway(tmp_path, {MODEL: {"replicas": [entry], "routing": routing}}))

            def feed() -> dict[str, Any]:
                return dict(gateway.replicas()["liar"]["kv_events"])

            def joined() -> bool:  # ZMQ's slow joiner: publish until a batch gets through
                publish(_batch(1, 1, None))
                time.sleep(0.05)
                return int(feed().get("batches", 0)) > 0

            eventually(joined, timeout_s=10)
            time.sleep(0.5)  # a few scrapes: the replica's cache_config_info is known
            before_kb, batches = _rss_kb(gateway), int(feed()["batches"])
            parent: int | None = None
            for n in range(BATCHES):
                publish(_batch(10 + n * PER_BATCH, PER_BATCH, parent))
                parent = 10 + (n + 1) * PER_BATCH - 1
            eventually(lambda: int(feed()["batches"]) >= batches + BATCHES, timeout_s=30)
            time.sleep(0.3)
            state = feed()
            rise_mb = (_rss_kb(gateway) - before_kb) / 1024
            served = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat(), timeout=20).status_code
            report(
                "KV publisher naming 200,000 blocks, capacity 64",
                [],
                blocks=state.get("blocks"),
                capacity=state.get("capacity_blocks"),
                rss_rise_mb=round(rise_mb, 1),
                served=served,
            )
            assert state["blocks"] <= CAPACITY, state
            assert served == 200
    finally:
        pub.close(linger=0)
        ctx.term()
