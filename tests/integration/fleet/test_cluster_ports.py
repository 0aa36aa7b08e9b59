"""`affinity-gateway up` (lab.cluster): a port probed free can be taken before the replica
stub binds it (another process's outgoing connection took it once in CI); that stub exits at start
and is started again on fresh ports instead of failing the whole cluster."""

from __future__ import annotations

import socket

import httpx
import pytest

from lab import cluster

pytestmark = pytest.mark.timeout(60)


def test_a_replica_whose_port_was_taken_is_started_again_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        real = cluster.free_port
        first = [taken.getsockname()[1]]
        monkeypatch.setattr(cluster, "free_port", lambda: first.pop() if first else real())
        spec = cluster.ClusterSpec(replicas=1, port=real(), speedup=50, log_level="warning", kv_events=False)
        with cluster.started(spec) as up:
            replicas = httpx.get(f"{up.urls[0]}/admin/replicas", timeout=5).json()["stub-model"]["replicas"]
            assert len(replicas) == 1 and not replicas[0]["url"].endswith(f":{taken.getsockname()[1]}")
            answer = httpx.post(
                f"{up.urls[0]}/v1/completions",
                timeout=10,
                json={"model": "stub-model", "prompt": "hi", "max_tokens": 2},
            )
            assert answer.status_code == 200
