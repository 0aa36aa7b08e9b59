"""Kubernetes labels → pools, adapters and roles: the config rules (errors name the key), what a slice's
labels give its pods, and the running state taking a discovered pod's adapters and role (also when the
pod is relabelled). End to end through a gateway process: tests/integration/routing/test_k8s_labels_routing.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from lightkube.resources.discovery_v1 import EndpointSlice
from prometheus_client import CollectorRegistry

from gateway.config.kubernetes import KubernetesDiscoveryConfig
from gateway.config.loader import load_config, parse_config
from gateway.config.pools import DiscoveryConfig, ReplicaConfig
from gateway.errors import ConfigError
from gateway.observability.routing_metrics import RoutingMetrics
from gateway.replicas.discovery.kubernetes import endpoints_of, replica_configs
from gateway.routing.route_table import RouteTable
from tests.k8s_api import endpoint_slice

pytestmark = pytest.mark.timeout(30)

LABELS = {
    "pool_label": "affinity-gateway.io/pool",
    "adapter_label_prefix": "adapters.affinity-gateway.io/",
    "role_label": "affinity-gateway.io/role",
}


def data(pool: str, kubernetes: dict[str, Any]) -> dict[str, Any]:
    return {"pools": {pool: {"discovery": {"kubernetes": kubernetes}, "routing": {"policy": "round_robin"}}}}


def test_the_selector_joins_labels_pool_label_and_service() -> None:
    config = parse_config(data("llama", {"labels": {"app.kubernetes.io/part-of": "llm"}, **LABELS}))
    k8s = config.pools["llama"].discovery.kubernetes  # type: ignore[union-attr]
    assert k8s is not None and k8s.service is None
    assert k8s.selector("llama") == {"app.kubernetes.io/part-of": "llm", "affinity-gateway.io/pool": "llama"}
    named = KubernetesDiscoveryConfig(service="vllm", pool_label="p", pool_value="qwen3")
    assert named.selector("Qwen/Qwen3-8B") == {"p": "qwen3", "kubernetes.io/service-name": "vllm"}


@pytest.mark.parametrize(
    ("pool", "kubernetes", "key"),
    [
        ("m", {}, "service"),  # an empty selector would take every slice of the namespace
        ("Qwen/Qwen3-8B", {"pool_label": "affinity-gateway.io/pool"}, "pool_value"),  # no label value
        ("m", {"service": "v", "pool_value": "m"}, "pool_value"),  # without pool_label
        ("m", {"pool_label": "p", "pool_value": "a/b"}, "pool_value"),
        ("m", {"pool_label": "-bad-"}, "pool_label"),
        ("m", {"service": "v", "role_label": "a b"}, "role_label"),
        ("m", {"service": "v", "adapter_label_prefix": "adapters"}, "adapter_label_prefix"),  # no trailing /
        ("m", {"labels": {"ok": "not ok!"}}, "labels.ok"),
        ("m", {"labels": {"bad key!": "v"}}, "labels"),
    ],
)
def test_bad_label_settings_name_their_key(pool: str, kubernetes: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"pools\.{pool}\.discovery\.kubernetes\.{key}\b"):
        parse_config(data(pool, kubernetes))


def test_a_static_replica_may_declare_its_role_and_a_wrong_one_names_the_key() -> None:
    replica = {"url": "http://a:1", "name": "a", "role": "prefill"}
    config = parse_config({"pools": {"m": {"replicas": [replica]}}})
    assert config.pools["m"].replicas[0].role == "prefill"
    with pytest.raises(ConfigError, match=r"pools\.m\.replicas\[0\]\.role"):
        parse_config({"pools": {"m": {"replicas": [{**replica, "role": "encode"}]}}})


def slice_of(raw: dict[str, Any]) -> EndpointSlice:
    return cast(EndpointSlice, EndpointSlice.from_dict(raw))


def test_a_slices_labels_give_its_pods_their_adapters_and_role() -> None:
    k8s = KubernetesDiscoveryConfig(
        pool_label=LABELS["pool_label"],
        adapter_label_prefix=LABELS["adapter_label_prefix"],
        role_label=LABELS["role_label"],
    )
    spec = DiscoveryConfig(kubernetes=k8s, port=8000)
    labels = {
        "affinity-gateway.io/pool": "llama",
        "affinity-gateway.io/role": "prefill",
        "adapters.affinity-gateway.io/sql-lora": "true",
        "adapters.affinity-gateway.io/old": "false",
        "other.io/x": "true",
    }
    item = slice_of(endpoint_slice("s", "llama", {"p-0": ("10.0.0.2", True)}, 8000, labels=labels))
    selector = k8s.selector("llama")
    (replica,), _ = replica_configs(spec, endpoints_of(item, spec, selector))
    assert (replica.replica_id, replica.adapters, replica.role) == ("p-0", ("sql-lora",), "prefill")
    assert endpoints_of(item, spec, k8s.selector("qwen")) == []  # another pool's slice
    unknown = slice_of(
        endpoint_slice(
            "s", "llama", {"p-0": ("10.0.0.2", True)}, 8000, labels={**labels, "affinity-gateway.io/role": "encode"}
        )
    )
    assert [e.role for e in endpoints_of(unknown, spec, selector)] == ["both"]  # logged, still serves


async def test_a_discovered_pods_labels_reach_the_adapter_map_and_admin(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(
        yaml.safe_dump({"pools": {"base": {"discovery": {"dns": "replicas"}, "routing": {"policy": "round_robin"}}}})
    )
    state = RouteTable(load_config(path), path, RoutingMetrics(CollectorRegistry()))

    async def no_records(name: str, port: int) -> list[str]:
        return []

    state.resolver = no_records
    await state.start()
    try:
        pod = ReplicaConfig(url="http://10.0.0.2:8000", name="pod-0", adapters=("labelled",), role="prefill")
        await state._discovered("base", [pod], frozenset())
        replica = state.routes["base"].pool.get("pod-0")
        assert replica is not None and replica.describe()["role"] == "prefill"
        assert replica.describe()["adapters"] == ["labelled"]  # from its labels alone: no /v1/models answered
        assert state.adapters.servers["labelled"] == frozenset({"pod-0"})
        assert state.route_for("labelled").model == "base"
        relabelled = ReplicaConfig(url="http://10.0.0.2:8000", name="pod-0", role="decode")
        await state._discovered("base", [relabelled], frozenset())
        assert state.routes["base"].pool.get("pod-0") is replica and replica.role == "decode"  # same replica
        assert "labelled" not in state.adapters.servers
    finally:
        await state.close()
