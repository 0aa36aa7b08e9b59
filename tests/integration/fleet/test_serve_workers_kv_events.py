"""`serve --workers N` shares one KV-event subscription per replica: worker 0 subscribes and relays the
batches to the other workers (`gateway.index.kv_events.relay`), so each replica stub counts one subscriber
(`/debug/kv_cache`), and still every worker holds the exact tables: each mirrors the stubs' caches, and a
request any worker answers is routed on the events rung to the replica that caches its prompt, whose
cached tokens are what every worker predicted. With worker 0 killed, the batches published meanwhile
reach the others through the replicas' replay sockets once it is back. Real processes: the supervisor,
its workers, two replica stubs publishing KV events."""

from __future__ import annotations

import os
import signal
from collections import Counter
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.fleet.test_serve_workers import _all_up, _children
from tests.integration.gateway_procs import MODEL, Gateway, running, start_gateway
from tests.integration.reliability_tools import eventually
from tests.integration.routing.test_kv_events_routing import Replica, chat, prompt, start_replica, stub_cache

pytestmark = pytest.mark.timeout(120)
WORKERS = 3
ASKS = 24  # requests on fresh connections: each worker answers some (all but certain: 3 x (2/3)^24 < 3e-4)
_NUDGES = count()


def _samples(gateway: Gateway, name: str) -> list[tuple[dict[str, str], float]]:
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    return [(s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def _per_worker(gateway: Gateway, name: str, **labels: str) -> Counter[str]:
    """A counter's value in each worker (summed over its other labels), from the merged /metrics."""
    found: Counter[str] = Counter()
    for sample_labels, value in _samples(gateway, name):
        if labels.items() <= sample_labels.items():
            found[sample_labels["worker"]] += value
    return found


def worker_tables(gateway: Gateway) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """Per (worker, replica): whether its KV-event table is certain (1.0), and its blocks, from the merged /metrics."""
    certain = {(lab["worker"], lab["replica"]): v for lab, v in _samples(gateway, "affinity_gateway_kv_events_certain")}
    blocks = {(lab["worker"], lab["replica"]): v for lab, v in _samples(gateway, "affinity_gateway_kv_events_blocks")}
    return certain, blocks


def _every_worker_mirrors(gateway: Gateway, replicas: list[Replica]) -> bool:
    """In every worker, each replica's table is certain and holds as many blocks as the stub's cache."""
    truth = {r.stub.replica_id: stub_cache(r)["cached_blocks"] for r in replicas}
    certain, blocks = worker_tables(gateway)
    wanted = {(str(w), r) for w in range(WORKERS) for r in truth}
    return (
        set(certain) == set(blocks) == wanted
        and all(v == 1.0 for v in certain.values())
        and all(blocks[(w, r)] == truth[r] for w, r in wanted)
    )


def _subscribers(replicas: list[Replica]) -> list[int]:
    return [stub_cache(r)["kv_events"]["subscribers"] for r in replicas]


def _ask(gateway: Gateway, messages: list[dict[str, str]]) -> tuple[str, int]:
    """One request on a fresh connection (the kernel picks a worker per connection): who answered, cached tokens."""
    body = {"model": MODEL, "messages": messages, "max_tokens": 4}
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=20)
    assert answer.status_code == 200, answer.text
    return answer.headers["X-Replica-Id"], answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def _every_worker_routes_on_the_events(gateway: Gateway, messages: list[dict[str, str]], home: str) -> None:
    """`messages`, cached at `home`, asked `ASKS` times: every worker answers some, each from `home` on the
    events rung, with the same cached tokens (the whole prompt's blocks but the last partial one)."""
    requests, events = (_per_worker(gateway, "affinity_gateway_requests_total"), _events(gateway))
    answers = [_ask(gateway, messages) for _ in range(ASKS)]
    answered = _per_worker(gateway, "affinity_gateway_requests_total") - requests
    assert sorted(answered) == [str(w) for w in range(WORKERS)], f"not every worker answered: {answered}"
    assert _events(gateway) - events == answered  # each of its decisions on the events rung
    assert {replica for replica, _ in answers} == {home}
    cached = {tokens for _, tokens in answers}
    assert len(cached) == 1 and cached.pop() >= 15 * 16, cached


def _events(gateway: Gateway) -> Counter[str]:
    return _per_worker(gateway, "affinity_gateway_route_evidence_total", evidence="events")


def _nudged(gateway: Gateway, replicas: list[Replica]) -> bool:
    """A small new batch from every stub (straight to it): a table that missed batches sees the gap."""
    for replica in replicas:
        chat(replica.stub.url, prompt(f"nudge{next(_NUDGES)}-", 10))
    return _every_worker_mirrors(gateway, replicas)


def test_workers_share_one_kv_event_subscription_and_every_worker_routes_on_the_exact_tables(tmp_path: Path) -> None:
    with running() as track:
        replicas = [start_replica(f"replica-{i}") for i in range(2)]
        for replica in replicas:
            track(replica.stub)
        pool: dict[str, Any] = {
            "replicas": [
                {
                    "url": r.stub.url,
                    "name": r.stub.replica_id,
                    "kv_events": {"endpoint": r.events, "replay_endpoint": r.replay},
                }
                for r in replicas
            ],
            "routing": {"policy": "prefix_affinity", "prefix": {"tokenizer": "sim", "block_tokens": 16}},
        }
        gateway = track(start_gateway(tmp_path, {MODEL: pool}, flags=["--workers", str(WORKERS)]))
        eventually(lambda: _all_up(gateway.url, WORKERS), timeout_s=30, interval_s=0.2)
        eventually(lambda: _every_worker_mirrors(gateway, replicas), timeout_s=15, interval_s=0.2)
        assert _subscribers(replicas) == [1, 1]  # worker 0's; one per worker before

        first = prompt("alpha")
        home, _ = _ask(gateway, first)
        eventually(lambda: _every_worker_mirrors(gateway, replicas), timeout_s=10, interval_s=0.1)
        _every_worker_routes_on_the_events(gateway, first, home)
        replays = [stub_cache(r)["kv_events"]["replays"] for r in replicas]
        assert all(n <= 2 * WORKERS for n in replays), replays  # each worker's start, and a gap now and then

        owner = min(_children(gateway.proc.popen.pid))  # the workers start in order: worker 0 first
        os.kill(owner, signal.SIGKILL)
        missed = prompt("beta")  # while worker 0 is away: no worker hears of it live
        direct = next(r for r in replicas if r.stub.replica_id != home)
        chat(direct.stub.url, missed)
        eventually(lambda: _all_up(gateway.url, WORKERS), timeout_s=30, interval_s=0.2)
        eventually(lambda: _nudged(gateway, replicas), timeout_s=15, interval_s=0.3)
        _every_worker_routes_on_the_events(gateway, missed, direct.stub.replica_id)
        eventually(lambda: _subscribers(replicas) == [1, 1], timeout_s=5)  # the new worker 0's
