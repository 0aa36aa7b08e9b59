"""The chart as a fleet runs it (issue 36): keys from Secrets mounted where the generated config reads
them, tracing, an Ingress, a second pool, extra env and volumes; and the values schema, generated from
values.yaml, that turns a misspelt or mistyped value into an install error. The rendering, lint and
Kubernetes-schema checks of every values file (values-vllm-fleet.yaml included) are in test_helm.py."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest

from tests.unit.deploy import values_schema
from tests.unit.deploy.test_helm import (
    CHART,
    KUBE_VERSION,
    containers,
    gateway_yaml,
    helm,
    objects,
    one,
    render,
    replica_workload,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"replicas": {"mode": "sglang"}}, "/replicas/mode"),
        ({"discovery": {"mode": "consul"}}, "/discovery/mode"),
        ({"gateway": {"replicaCont": 3}}, "replicaCont"),  # misspelt: no longer ignored
        ({"gateway": {"workers": "two"}}, "/gateway/workers"),
        ({"tracing": {"samplingRatio": 2}}, "/tracing/samplingRatio"),
        ({"extraPools": [{"name": "other"}]}, "service"),
    ],
)
def test_the_values_schema_rejects_unknown_values_wrong_types_and_modes(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
        render(overrides)


def test_the_values_schema_is_generated_from_values_yaml() -> None:
    assert (CHART / "values.schema.json").read_text() == values_schema.text(), (
        "run: .venv/bin/python -m tests.unit.deploy.values_schema"
    )


def test_fleet_keys_come_from_secrets_mounted_where_the_config_reads_them() -> None:
    # Issue 36: the chart could not mount key files; the vLLM example with keys from Secrets, tracing and two pools.
    name = "values-vllm-fleet.yaml"
    data, gateway = gateway_yaml(name), one(name, "Deployment", "gateway")
    (c,) = containers(gateway)
    volumes = {v["name"]: v for v in gateway["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}

    def secret_of(path: str) -> tuple[str, str]:
        """(Secret, key) mounted at `path`."""
        directory, key = path.rsplit("/", 1)
        secret = mounts[directory]["secret"]
        assert key in [item["path"] for item in secret["items"]]
        return secret["secretName"], key

    assert [secret_of(k["sha256_file"]) for k in data["auth"]["keys"]] == [
        ("gateway-keys", "clients"),
        ("gateway-keys", "admins"),
    ]
    assert [k.get("admin", False) for k in data["auth"]["keys"]] == [False, True]
    assert data["auth"]["keys"][0]["requests_per_minute"] == 600
    assert secret_of(data["pools"]["qwen3-8b"]["api_key_file"]) == ("vllm-key", "api-key")
    (vllm,) = containers(replica_workload(name))
    env = {e["name"]: e for e in vllm["env"]}
    assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "vllm-key", "key": "api-key"}
    assert data["tracing"] == {
        "enabled": True,
        "endpoint": "http://otel-collector.observability:4318",
        "service_name": "affinity-gateway",
        "sampling_ratio": 0.1,
    }
    assert set(data["pools"]) == {"qwen3-8b", "llama-3-70b"}
    assert data["pools"]["llama-3-70b"]["discovery"]["dns"] == "llama-70b-vllm"
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in c["env"] and "/opt/tokenizers" in mounts
    (ingress,) = objects(name, "Ingress")
    (rule,) = ingress["spec"]["rules"]
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": one(name, "Service", "gateway")["metadata"]["name"], "port": {"name": "http"}}


def test_without_secrets_nothing_is_mounted_and_no_key_is_configured() -> None:
    data, (c,) = gateway_yaml("values.yaml"), containers(one("values.yaml", "Deployment", "gateway"))
    assert "auth" not in data and "tracing" not in data and not objects("values.yaml", "Ingress")
    assert [m["mountPath"] for m in c["volumeMounts"]] == ["/etc/affinity-gateway"]


def test_a_replicas_only_release_serves_another_releases_extra_pool() -> None:
    rendered = render(
        {
            "gateway": {"enabled": False},
            "replicas": {"mode": "vllm"},
            "pool": {"name": "llama-3-70b"},
            "serviceMonitor": {"enabled": True},
        }
    )
    components = {(d["kind"], d["metadata"]["labels"]["app.kubernetes.io/component"]) for d in rendered}
    assert components == {("StatefulSet", "replica"), ("Service", "replica"), ("ServiceMonitor", "replica")}
    for doc in rendered:
        if doc["apiVersion"] != "monitoring.coreos.com/v1":
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    (service,) = [d for d in rendered if d["kind"] == "Service"]
    assert service["metadata"]["name"] == "ag-affinity-gateway-replica"  # what extraPools[].service names
