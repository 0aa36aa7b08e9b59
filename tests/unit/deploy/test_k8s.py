"""deploy/k8s: the manifests parse, and names, labels, ports, probes and the gateway's config agree."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml

from gateway.config.loader import Config, parse_config
from tests.unit.deploy.deployfiles import DEPLOY, find, flag, host_port, k8s_docs, stub_args

DOCS = k8s_docs()
WORKLOADS = [d for d in DOCS if d["kind"] in ("Deployment", "StatefulSet")]


def pod(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (only,) = pod(workload)["containers"]
    return only


def port_number(c: dict[str, Any], port: int | str) -> int:
    """A container port given by name or number."""
    if isinstance(port, int):
        assert port in {p["containerPort"] for p in c["ports"]}
        return port
    (number,) = [p["containerPort"] for p in c["ports"] if p["name"] == port]
    return int(number)


def selected(selector: dict[str, str]) -> list[dict[str, Any]]:
    return [w for w in WORKLOADS if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]


def gateway_config() -> tuple[Config, dict[str, Any]]:
    gateway = find(DOCS, "Deployment", "affinity-gateway")
    c = container(gateway)
    (volume,) = pod(gateway)["volumes"]
    (mount,) = c["volumeMounts"]
    assert mount["name"] == volume["name"]
    config_path = PurePosixPath(flag(c["args"], "--config"))
    assert config_path.parent == PurePosixPath(mount["mountPath"])
    config_map = find(DOCS, "ConfigMap", volume["configMap"]["name"])
    env = {e["name"]: e["value"] for e in c["env"]}
    return parse_config(yaml.safe_load(config_map["data"][config_path.name]), env), gateway


def test_manifests_hold_the_expected_objects_and_kustomize_lists_every_file() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in DOCS if "metadata" in d}
    assert {
        ("Deployment", "affinity-gateway"),
        ("Service", "affinity-gateway"),
        ("ConfigMap", "affinity-gateway-config"),
        ("PodDisruptionBudget", "affinity-gateway"),
        ("Deployment", "redis"),
        ("Service", "redis"),
        ("StatefulSet", "replica"),
        ("Service", "replica"),
    } <= kinds
    (kustomization,) = [d for d in DOCS if d["kind"] == "Kustomization"]
    files = {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    images = {i["name"] for i in kustomization["images"]}
    assert {container(w)["image"].split(":")[0] for w in WORKLOADS if "redis" not in container(w)["image"]} == images


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w["metadata"]["name"])
def test_workload_selectors_match_their_pods_and_run_locked_down(workload: dict[str, Any]) -> None:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pod(workload)["securityContext"]["runAsNonRoot"] is True
    c = container(workload)
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert "memory" in c["resources"]["limits"] and c["readinessProbe"] and c["livenessProbe"]


@pytest.mark.parametrize("service", [d for d in DOCS if d["kind"] == "Service"], ids=lambda s: s["metadata"]["name"])
def test_services_select_one_workload_and_target_a_declared_port(service: dict[str, Any]) -> None:
    (workload,) = selected(service["spec"]["selector"])
    for port in service["spec"]["ports"]:
        port_number(container(workload), port["targetPort"])


def test_gateway_probes_ready_and_health_on_its_listen_port() -> None:
    config, gateway = gateway_config()
    c = container(gateway)
    assert gateway["spec"]["replicas"] >= 2
    readiness, liveness = c["readinessProbe"]["httpGet"], c["livenessProbe"]["httpGet"]
    assert readiness["path"] == "/ready" and liveness["path"] == "/health"
    assert port_number(c, readiness["port"]) == port_number(c, liveness["port"]) == config.listen.port
    assert config.listen.host == "0.0.0.0"
    service = find(DOCS, "Service", "affinity-gateway")
    assert selected(service["spec"]["selector"]) == [gateway]
    assert gateway["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    drain_s = config.shutdown.ready_delay_s + config.shutdown.grace_s + 1  # SIGTERM → exited, before SIGKILL
    assert config.shutdown.ready_delay_s > 0 and pod(gateway)["terminationGracePeriodSeconds"] > drain_s


def test_disruption_budget_covers_the_gateways_and_leaves_room_to_drain() -> None:
    _, gateway = gateway_config()
    pdb = find(DOCS, "PodDisruptionBudget", "affinity-gateway")
    assert selected(pdb["spec"]["selector"]["matchLabels"]) == [gateway]
    assert 1 <= pdb["spec"]["minAvailable"] < gateway["spec"]["replicas"]


def test_gateway_discovers_the_headless_replica_service_and_shares_the_redis_service() -> None:
    config, _ = gateway_config()
    ((model, pool),) = config.pools.items()
    assert pool.discovery is not None and not pool.replicas
    headless = find(DOCS, "Service", pool.discovery.dns)
    assert headless["spec"]["clusterIP"] == "None"
    ports = {p["name"]: p for p in headless["spec"]["ports"]}
    (replicas,) = selected(headless["spec"]["selector"])
    assert replicas["kind"] == "StatefulSet" and replicas["spec"]["serviceName"] == pool.discovery.dns
    c = container(replicas)
    http, events, replay = ports["http"], ports["kv-events"], ports["kv-replay"]
    assert http["port"] == port_number(c, http["targetPort"]) == pool.discovery.port
    args = stub_args(c["args"])
    assert args.model == model and args.port == pool.discovery.port and args.host == "0.0.0.0"
    # the KV-event feeds: what the gateway subscribes to is what each pod publishes
    assert events["port"] == port_number(c, events["targetPort"]) == pool.discovery.kv_events_port
    assert replay["port"] == port_number(c, replay["targetPort"]) == pool.discovery.kv_events_replay_port
    assert args.kv_events_endpoint == f"tcp://*:{pool.discovery.kv_events_port}"
    assert args.kv_events_replay_endpoint == f"tcp://*:{pool.discovery.kv_events_replay_port}"
    assert pool.routing.prefix.tokenizer == "sim" and args.engine == "sim"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"  # DNS lists only ready pods
    assert config.index.store == "redis" and config.redis is not None
    host, redis_port = host_port(config.redis.resolved_url, 6379)
    redis_service = find(DOCS, "Service", host)
    (redis_spec,) = redis_service["spec"]["ports"]
    (redis,) = selected(redis_service["spec"]["selector"])
    assert redis_spec["port"] == redis_port and port_number(container(redis), redis_spec["targetPort"]) == 6379


def test_the_gateway_account_may_watch_endpoint_slices_and_nothing_else() -> None:
    _, gateway = gateway_config()
    account = pod(gateway)["serviceAccountName"]
    assert find(DOCS, "ServiceAccount", account)
    (binding,) = [d for d in DOCS if d["kind"] == "RoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    role = find(DOCS, "Role", binding["roleRef"]["name"])
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}
    ]
