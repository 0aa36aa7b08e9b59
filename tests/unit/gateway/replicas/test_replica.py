"""Replica health state machine, pool candidates and in-flight tracking, /metrics parsing, probes."""

from __future__ import annotations

import time

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from gateway.config.loader import parse_config
from gateway.config.sections import HealthConfig
from gateway.replicas import Replica, ReplicaPool
from gateway.replicas.health import probe
from gateway.replicas.load import parse_metrics, scrape
from tests.upstream import FakeReplica

HEALTH = HealthConfig(unhealthy_after=2, healthy_after=2, eject_after_failures=2, backoff_s=0.05, backoff_max_s=0.1)


def test_probes_flip_health_after_thresholds() -> None:
    r = Replica("a", "http://a")
    r.probe_result(False, HEALTH)
    assert r.is_available()
    r.probe_result(False, HEALTH)
    assert not r.is_available()
    r.probe_result(True, HEALTH)
    assert not r.is_available()
    r.probe_result(True, HEALTH)
    assert r.is_available()


def test_upstream_faults_open_the_breaker_then_one_trial_closes_it() -> None:
    r = Replica("a", "http://a")
    pool = ReplicaPool("m", [r, Replica("b", "http://b")])
    assert not r.request_failed(HEALTH, "boom")
    assert r.request_failed(HEALTH, "boom")
    assert not r.is_available() and 0.04 < r.breaker.open_until - time.monotonic() <= 0.05
    for _ in range(HEALTH.healthy_after):
        r.probe_result(True, HEALTH)
    assert not r.is_available(), "probes during the backoff do not bring it back"
    time.sleep(0.06)
    assert r.describe()["breaker"] == "half_open" and pool.num_available() == 2
    with pool.track(r):
        assert [c.replica_id for c in pool.candidates()] == ["b"], "one trial at a time"
    assert pool.num_available() == 2, "a trial that ended without a verdict frees the slot"
    with pool.track(r):
        r.request_succeeded()
    assert r.describe()["breaker"] == "closed" and r.breaker.openings == 0


def test_pool_candidates_skip_unavailable_and_excluded() -> None:
    pool = ReplicaPool("m", [Replica("a", "http://a", weight=2), Replica("b", "http://b"), Replica("c", "http://c")])
    pool.get("b").healthy = False  # type: ignore[union-attr]
    assert [c.replica_id for c in pool.candidates()] == ["a", "c"]
    assert [c.replica_id for c in pool.candidates(exclude={"a"})] == ["c"]
    assert pool.candidates()[0].weight == 2 and pool.num_available() == 2


def test_track_is_exact_on_every_exit() -> None:
    pool = ReplicaPool("m", [Replica("a", "http://a")])
    replica = pool.get("a")
    assert replica is not None
    with pool.track(replica):
        with pool.track(replica):
            assert pool.candidates()[0].in_flight == 2
    with pytest.raises(RuntimeError), pool.track(replica):
        raise RuntimeError
    assert replica.in_flight == 0


def test_pool_add_remove_replace_keeps_state() -> None:
    pool = ReplicaPool("m", [Replica("a", "http://a"), Replica("b", "http://b")])
    a = pool.get("a")
    assert a is not None
    a.in_flight = 3
    pool.replace([Replica("a", "http://a2", weight=5), Replica("c", "http://c")])
    assert [r.replica_id for r in pool] == ["a", "c"]
    assert pool.get("a") is a and (a.url, a.weight, a.in_flight) == ("http://a2", 5, 3)
    assert pool.remove("c") is not None and len(pool) == 1


VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="4096"} 1.0
garbage line here
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (VLLM_METRICS, (5, 4, 0.375, 4096, 16)),
        ("vllm:gpu_cache_usage_perc 0.7\nvllm:num_requests_waiting 1\n", (0, 1, 0.7, None, None)),
        ("sglang:num_running_reqs 2\nsglang:num_queue_reqs 3\nsglang:token_usage 0.1\n", (2, 3, 0.1, None, None)),
        ("", (0, 0, 0.0, None, None)),
    ],
    ids=["vllm-v1-two-engines", "old-vllm-name", "sglang", "empty"],
)
def test_parse_metrics_is_tolerant(text: str, expected: tuple[object, ...]) -> None:
    load = parse_metrics(text)
    assert (load.running, load.waiting, load.kv_usage, load.num_gpu_blocks, load.block_size) == expected


async def test_probe_and_scrape_against_a_replica() -> None:
    fake = FakeReplica("a", metrics_text=VLLM_METRICS)
    server = TestServer(fake.app)
    await server.start_server()
    replica = Replica("a", str(server.make_url("")).rstrip("/"))
    config = parse_config({"pools": {"m": {"replicas": [{"url": replica.url}]}}, "health": {"unhealthy_after": 1}})
    async with ClientSession() as session:
        assert await scrape(session, replica, "/metrics", 1.0)
        assert replica.load.running == 5 and replica.load.num_gpu_blocks == 4096
        fake.healthy = False
        await probe(session, replica, config)
        assert not replica.is_available() and "503" in replica.last_error
        await server.close()
        assert not await scrape(session, replica, "/metrics", 1.0)
        assert replica.load.running == 0 and replica.load.num_gpu_blocks == 4096, "cache shape survives"
