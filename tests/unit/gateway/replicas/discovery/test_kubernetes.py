"""Kubernetes discovery: config rules, EndpointSlice → replica mapping, and the list-then-watch loop
against `tests.k8s_api` (a stand-in for the API server, which cannot run here): a broken watch
resumes from its resourceVersion, a 410 Gone relists."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from lightkube.resources.discovery_v1 import EndpointSlice

from gateway.config.kubernetes import KubernetesDiscoveryConfig
from gateway.config.loader import parse_config
from gateway.config.pools import DiscoveryConfig, ReplicaConfig
from gateway.errors import ConfigError
from gateway.replicas.discovery.kubernetes import endpoints_of, replica_configs, watch_slices
from tests.helpers import ROOT
from tests.k8s_api import FakeSliceAPI, endpoint_slice

pytestmark = pytest.mark.timeout(30)


def data(discovery: dict[str, Any]) -> dict[str, Any]:
    return {"pools": {"m": {"discovery": discovery, "routing": {"policy": "round_robin"}}}}


def test_kubernetes_discovery_loads_and_is_exclusive_with_dns() -> None:
    config = parse_config(
        data({"kubernetes": {"service": "vllm", "namespace": "ml", "port_name": "http", "labels": {"tier": "gpu"}}})
    )
    spec = config.pools["m"].discovery
    assert spec is not None and spec.kubernetes == KubernetesDiscoveryConfig(
        service="vllm", namespace="ml", port_name="http", labels={"tier": "gpu"}
    )
    with pytest.raises(ConfigError, match=r"pools\.m\.discovery\.kubernetes: set exactly one of"):
        parse_config(data({"dns": "r", "kubernetes": {"service": "vllm"}}))
    with pytest.raises(ConfigError, match=r"pools\.m\.discovery\.dns: set exactly one of"):
        parse_config(data({"port": 8000}))


@pytest.mark.parametrize(
    ("key", "value"), [("service", "Not_A_Name"), ("namespace", "a/b"), ("retry_s", 0), ("nope", 1)]
)
def test_bad_kubernetes_values_name_their_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=rf"pools\.m\.discovery\.kubernetes\.{key}"):
        parse_config(data({"kubernetes": {"service": "vllm", key: value}}))


def test_serving_without_kubernetes_discovery_never_loads_the_client() -> None:
    code = "import sys, gateway.serving.app, gateway.routing.route_table; print('lightkube' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def slice_of(raw: dict[str, Any]) -> EndpointSlice:
    return EndpointSlice.from_dict(raw)


def test_pods_become_named_replicas_and_unready_ones_are_marked() -> None:
    spec = DiscoveryConfig(kubernetes=KubernetesDiscoveryConfig(service="vllm", port_name="http"), kv_events_port=5557)
    a = slice_of(endpoint_slice("vllm-a", "vllm", {"vllm-0": ("10.0.0.2", True), "vllm-1": ("10.0.0.3", False)}, 8000))
    b = slice_of(endpoint_slice("vllm-b", "vllm", {"vllm-1": ("10.0.0.3", True)}, 8000))  # moving between slices
    other_port = slice_of(endpoint_slice("x", "vllm", {"vllm-9": ("10.0.0.9", True)}, 9, port_name="metrics"))
    found = endpoints_of(a, spec) + endpoints_of(b, spec) + endpoints_of(other_port, spec)
    replicas, unready = replica_configs(spec, found)
    assert [(r.replica_id, r.url, r.kv_events and r.kv_events.endpoint) for r in replicas] == [
        ("vllm-0", "http://10.0.0.2:8000", "tcp://10.0.0.2:5557"),
        ("vllm-1", "http://10.0.0.3:8000", "tcp://10.0.0.3:5557"),
    ]
    assert unready == frozenset()  # ready in one slice is ready
    replicas, unready = replica_configs(spec, endpoints_of(a, spec))
    assert unready == {"vllm-1"}


class Recorder:
    """The `apply` callback: keeps every (replica ids, unready ids) it was handed."""

    def __init__(self) -> None:
        self.seen: list[tuple[list[str], frozenset[str]]] = []

    async def __call__(self, model: str, replicas: list[ReplicaConfig], unready: frozenset[str]) -> None:
        self.seen.append(([r.replica_id for r in replicas], unready))

    def last(self) -> list[str]:
        return self.seen[-1][0] if self.seen else []


async def until(check: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def watching(api: FakeSliceAPI, tmp_path: Path, apply: Recorder) -> asyncio.Task[None]:
    path = tmp_path / "kubeconfig"
    path.write_text(api.kubeconfig())
    spec = DiscoveryConfig(
        kubernetes=KubernetesDiscoveryConfig(service="vllm", port_name="http", kubeconfig=str(path), retry_s=0.05)
    )
    listed = asyncio.Event()
    task = asyncio.create_task(watch_slices("m", spec, apply, listed))
    await asyncio.wait_for(listed.wait(), 5)
    return task


async def test_a_broken_watch_resumes_from_its_resource_version(tmp_path: Path) -> None:
    async with FakeSliceAPI() as api:
        await api.put(endpoint_slice("vllm-a", "vllm", {"vllm-0": ("10.0.0.2", True)}, 8000))
        apply = Recorder()
        task = await watching(api, tmp_path, apply)
        try:
            assert apply.last() == ["vllm-0"]
            assert api.requests[0]["labelSelector"] == "kubernetes.io/service-name=vllm"
            await until(lambda: len(api.requests) == 2)  # the watch is open
            seen_version = str(api.version)
            await api.drop_watches()
            await api.put(endpoint_slice("vllm-b", "vllm", {"vllm-1": ("10.0.0.3", True)}, 8000))
            await until(lambda: apply.last() == ["vllm-0", "vllm-1"])
            lists = [q for q in api.requests if q.get("watch") != "true"]
            assert len(lists) == 1  # resumed, not relisted
            assert api.requests[2]["watch"] == "true" and api.requests[2]["resourceVersion"] == seen_version
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_410_gone_relists_and_a_removal_missed_meanwhile_still_removes(tmp_path: Path) -> None:
    async with FakeSliceAPI() as api:
        await api.put(endpoint_slice("vllm-a", "vllm", {"vllm-0": ("10.0.0.2", True)}, 8000))
        await api.put(endpoint_slice("vllm-b", "vllm", {"vllm-1": ("10.0.0.3", True)}, 8000))
        apply = Recorder()
        task = await watching(api, tmp_path, apply)
        try:
            assert apply.last() == ["vllm-0", "vllm-1"]
            await until(lambda: len(api.requests) == 2)
            api.compacted = api.version + 1  # the version the client holds is compacted away...
            api.events.clear()
            await api.drop_watches()
            await api.delete("vllm-a")  # ...with this deletion in the gap
            await until(lambda: apply.last() == ["vllm-1"])
            assert len([q for q in api.requests if q.get("watch") != "true"]) == 2  # listed again
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
