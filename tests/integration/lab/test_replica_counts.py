"""The bench's load share from the replicas' own counters (`lab.replica_counts`), read from real stubs:
what a peer's run in front of vLLM, whose answers name no replica, is measured by."""

from __future__ import annotations

import httpx
import pytest

from lab import cluster, replica_counts
from lab.cluster import free_port

pytestmark = pytest.mark.timeout(90)


def test_each_replica_counts_the_requests_it_finished_between_two_reads() -> None:
    spec = cluster.ClusterSpec(
        replicas=2, port=free_port(), speedup=50, log_level="warning", kv_events=False, policy="round_robin"
    )
    with cluster.started(spec) as up:
        before = replica_counts.finished(up.replicas)
        answered = []
        for i in range(5):  # round robin over two replicas: 3 and 2
            answer = httpx.post(
                f"{up.urls[0]}/v1/completions",
                timeout=10,
                json={"model": "stub-model", "prompt": f"question {i}", "max_tokens": 2},
            )
            assert answer.status_code == 200
            answered.append(answer.headers["X-Replica-Id"])
        served = replica_counts.served(["replica-0", "replica-1"], before, replica_counts.finished(up.replicas))
    assert served == {name: answered.count(name) for name in ("replica-0", "replica-1")}
    assert sorted(served.values()) == [2, 3]


def test_a_replica_that_cannot_be_read_gives_no_share() -> None:
    port = free_port()  # nothing listens there
    assert replica_counts.finished([f"http://127.0.0.1:{port}"]) is None
    assert replica_counts.served(["replica-0"], None, [3.0]) is None
