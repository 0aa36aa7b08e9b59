"""The chart as a fleet runs it (issue 36): keys from Secrets mounted where the generated config reads
them, tracing, an Ingress, a second pool, extra env and volumes; and the values schema, generated from
values.yaml, that turns a misspelt or mistyped value into an install error. The rendering, lint and
Kubernetes-schema checks of every values file (values-vllm-fleet.yaml included) are in test_helm.py."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gateway.config.env import interpolate
from gateway.config.loader import parse_config
from tests.unit.deploy import values_schema
from tests.unit.deploy.test_helm import (
    CHART,
    KUBE_VERSION,
    VALUES_FILES,
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
        ({"gateway": {"config": {"listen": {"prot": 1}}}}, "at '/gateway/config/listen': additional properties 'prot'"),
        ({"gateway": {"config": {"health": {"interval_s": "2s"}}}}, "/gateway/config/health/interval_s"),
        ({"pool": {"policy": "fastest"}}, "at '/pool/policy': value must be one of"),
        ({"extraPools": [{"name": "o", "service": "s", "policy": "fastest"}]}, "/extraPools/0/policy"),
        (
            {"gateway": {"config": {"pools": {"stub-model": {"routing": {"policy": "fastest"}}}}}},
            "/gateway/config/pools/stub-model/routing/policy",
        ),
    ],
)
def test_the_values_schema_rejects_unknown_values_wrong_types_and_modes(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
        render(overrides)


def test_a_partial_gateway_config_passes_the_schema_and_reaches_the_config() -> None:
    """Nothing of the gateway's config is required in `gateway.config`: it is merged over a complete one.
    A `${VAR}` stands for a number or a policy, as in the gateway's own files."""
    partial = {
        "listen": {"workers": "${WORKERS:-2}"},
        "pools": {"stub-model": {"routing": {"policy": "least_loaded", "params": {"seed": 7}}}},
        "limits": {"max_body_bytes": 1048576},
    }
    (config_map,) = [
        d
        for d in render({"gateway": {"config": partial}})
        if d["kind"] == "ConfigMap" and d["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"
    ]
    data = yaml.safe_load(config_map["data"]["gateway.yaml"])
    assert data["listen"] == partial["listen"] and data["limits"] == partial["limits"]
    routing = data["pools"]["stub-model"]["routing"]
    assert routing["policy"] == "least_loaded" and routing["prefix"]["block_tokens"] == 16  # merged, not replaced
    config = parse_config(interpolate(data, {"WORKERS": "3"}))
    assert config.listen.workers == 3 and config.pools["stub-model"].routing.policy == "least_loaded"


@pytest.mark.parametrize("name", VALUES_FILES)
def test_every_generated_config_passes_the_embedded_gateway_schema(name: str) -> None:
    """The schema `gateway.config` is checked by accepts the complete configs the chart writes, and is
    itself a draft-07 schema (what Helm reads) without `required`."""
    embedded = values_schema.schema()["properties"]["gateway"]["properties"]["config"]
    jsonschema.Draft7Validator.check_schema(embedded)
    assert '"required"' not in json.dumps(embedded)
    assert list(jsonschema.Draft7Validator(embedded).iter_errors(gateway_yaml(name))) == []


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
