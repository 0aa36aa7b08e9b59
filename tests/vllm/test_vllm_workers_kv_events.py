"""`serve --workers 2` in front of real vLLM: worker 0 alone subscribes to each replica's KV events and
relays them (`gateway.index.kv_events.relay`); the other worker's tables, fed only by that relay, are
certain and hold what worker 0's hold, and a conversation's later turn, on whichever worker, is routed on
the events rung to the replica that caches it. vLLM does not say how many subscribers it has; the
subscriber count is tested against the replica stub (tests/integration/fleet/test_serve_workers_kv_events.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.fleet.test_serve_workers import _all_up
from tests.integration.fleet.test_serve_workers_kv_events import _per_worker, worker_tables
from tests.integration.gateway_procs import STEADY_HEALTH, Gateway, start_gateway
from tests.integration.reliability_tools import eventually
from tests.vllm.conftest import MODEL, VLLMPair, chat_turn, gateway_config
from tests.vllm.test_vllm_cache_state import QUESTIONS, system_prompt

pytestmark = pytest.mark.timeout(420)  # may be the first vLLM test: waits for the session's start-up
WORKERS = 2
REPLICAS = ("vllm-0", "vllm-1")


def _tables_agree(gateway: Gateway) -> bool:
    """Every worker's table of every replica is certain, and holds as many blocks as worker 0's."""
    certain, blocks = worker_tables(gateway)
    wanted = {(str(w), r) for w in range(WORKERS) for r in REPLICAS}
    return (
        set(certain) == set(blocks) == wanted
        and all(v == 1.0 for v in certain.values())
        and all(blocks[(w, r)] == blocks[("0", r)] for w, r in wanted)
    )


def test_the_relayed_events_give_every_worker_the_same_exact_tables(vllm: VLLMPair, tmp_path: Path) -> None:
    gateway = start_gateway(
        tmp_path,
        gateway_config(vllm),
        flags=["--workers", str(WORKERS)],
        timeouts={"connect_s": 2.0, "first_byte_s": 120.0},
        health=STEADY_HEALTH,
    )
    try:
        eventually(lambda: _all_up(gateway.url, WORKERS), timeout_s=60, interval_s=0.2)
        eventually(lambda: _tables_agree(gateway), timeout_s=30, interval_s=0.2)
        relays = {gateway.replicas(MODEL)[r]["kv_events"]["relay"]["endpoint"] for r in REPLICAS}
        assert len(relays) == 2 and all(e.startswith("ipc://@") for e in relays)  # one relay per replica
        events_before = _per_worker(gateway, "affinity_gateway_route_evidence_total", evidence="events")
        messages = [{"role": "system", "content": system_prompt()}]
        turns = []
        for question in QUESTIONS:  # fresh connections: the kernel spreads them over the workers
            messages.append({"role": "user", "content": question})
            turn, text = chat_turn(gateway, messages)
            turns.append(turn)
            messages.append({"role": "assistant", "content": text})
            eventually(lambda: _tables_agree(gateway), timeout_s=20, interval_s=0.1)
        assert [t.predicted for t in turns] == [t.reported for t in turns], turns
        assert all(t.reported > 0 for t in turns[1:]), turns  # later turns hit their home's cache
        events = _per_worker(gateway, "affinity_gateway_route_evidence_total", evidence="events") - events_before
        assert sum(events.values()) >= len(QUESTIONS) - 1, events  # decided on the events rung
    finally:
        gateway.stop()
