"""What a KV-event feed cannot see by itself, over real processes (stub replicas publishing as vLLM
does, a gateway subscribing): a publisher that never reaches the gateway although its replay
socket answers (vLLM given a non-wildcard endpoint), and a replica that restarts, seen going down
or, between two health probes, only by its engine counters going backwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.integration.gateway_procs import running
from tests.integration.reliability_tools import eventually
from tests.integration.routing.test_kv_events_routing import (
    chat,
    feed,
    gateway_for,
    predicted,
    prompt,
    start_replica,
    warm,
)

pytestmark = pytest.mark.timeout(60)


def test_a_publisher_that_never_reaches_the_gateway_turns_its_table_uncertain(tmp_path: Path) -> None:
    with running() as track:
        replica = start_replica()
        track(replica.stub)
        # Live batches go nowhere the gateway listens (as when vLLM connects its PUB socket); the replay binds.
        gateway = track(gateway_for(tmp_path, replica, events_endpoint=f"tcp://127.0.0.1:{free_port()}"))
        eventually(lambda: feed(gateway, replica)["certain"], timeout_s=10)  # the replay made it look in sync
        chat(gateway.url, prompt("alpha"))
        eventually(lambda: not feed(gateway, replica)["certain"], timeout_s=15)
        assert feed(gateway, replica)["silent"]


def test_a_restarted_replicas_table_is_dropped_before_its_first_batch(tmp_path: Path) -> None:
    with running() as track:
        replica = start_replica()
        track(replica.stub)
        gateway = track(gateway_for(tmp_path, replica))
        warm(gateway, replica, prompt("alpha"))
        assert predicted(gateway, prompt("alpha"))[0] > 0
        replica.stub.stop()
        again = start_replica(replica.stub.replica_id, replica.stub.port, replica.events, replica.replay)
        track(again.stub)
        eventually(lambda: gateway.replicas()[replica.stub.replica_id]["available"], timeout_s=10)
        state = feed(gateway, replica)
        assert state["blocks"] == 0 and state["resets"] >= 1, state  # no batch yet from the new engine
        assert predicted(gateway, prompt("alpha"))[0] == 0
        chat(gateway.url, prompt("alpha"))
        eventually(lambda: feed(gateway, replica)["certain"], timeout_s=10)


def test_a_restart_between_probes_is_seen_by_the_counters_going_backwards(tmp_path: Path) -> None:
    with running() as track:
        replica = start_replica()
        track(replica.stub)
        rare_probes = {"interval_s": 60.0, "timeout_s": 0.5, "unhealthy_after": 1, "healthy_after": 1}
        gateway = track(gateway_for(tmp_path, replica, health=rare_probes))
        warm(gateway, replica, prompt("alpha"))
        chat(gateway.url, prompt("beta"))
        replica_id = replica.stub.replica_id
        eventually(lambda: (gateway.replicas()[replica_id]["completed"] or 0) >= 2, timeout_s=10)  # scraped
        replica.stub.stop()
        again = start_replica(replica.stub.replica_id, replica.stub.port, replica.events, replica.replay)
        track(again.stub)
        eventually(lambda: feed(gateway, replica)["resets"] >= 1, timeout_s=10)
        assert "its engine counters went backwards" in gateway.proc.output()
        assert feed(gateway, replica)["blocks"] == 0 and predicted(gateway, prompt("alpha"))[0] == 0
