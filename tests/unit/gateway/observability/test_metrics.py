"""The replica collector reads live pool state at scrape time; names follow affinity_gateway_*."""

from __future__ import annotations

from gateway.observability.metrics import Metrics
from gateway.replicas import Replica, ReplicaPool


def test_pool_state_is_exported_at_scrape_time() -> None:
    pool = ReplicaPool("m", [Replica("a", "http://a"), Replica("b", "http://b")])
    metrics = Metrics()
    metrics.watch(lambda: [pool])
    replica = pool.get("a")
    assert replica is not None
    replica.in_flight, replica.load.waiting = 3, 2
    pool.get("b").healthy = False  # type: ignore[union-attr]
    text = metrics.render().decode()
    assert 'affinity_gateway_replica_in_flight{model_name="m",replica="a"} 3.0' in text
    assert 'affinity_gateway_replica_waiting{model_name="m",replica="a"} 2.0' in text
    assert 'affinity_gateway_replica_healthy{model_name="m",replica="b"} 0.0' in text
    pool.remove("b")
    assert 'replica="b"' not in metrics.render().decode()
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert all(name.startswith("affinity_gateway_") for name in names)


def test_no_created_series_beside_counters_and_histograms() -> None:
    metrics = Metrics()
    metrics.requests.labels("m", "r0", "200").inc()
    metrics.latency.labels("m").observe(0.1)
    text = metrics.render().decode()
    assert "affinity_gateway_requests_total" in text and "_created" not in text
