"""deploy/helm/affinity-gateway: the chart renders and lints with Helm's own engine for each values file,
every manifest validates against the Kubernetes schemas, and the parts agree with each other and with
the gateway's config loader and the replica stub's parser.

No `helm` binary is packaged for Linux on PyPI or Debian; helm-python-sdk (a dev extra) binds Helm's Go
SDK, so `Chart.render` is `helm template` and `lint` is `helm lint`. Without it the rendering tests skip.
The ServiceMonitor is the one object without a schema here (a CRD): its fields are checked by hand.
values-k8s-discovery.yaml is the Kubernetes-API discovery option: its account, Role and binding.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.config.loader import parse_config
from tests.unit.deploy.deployfiles import DEPLOY, flag, stub_args

helm = pytest.importorskip(
    "helm_python", reason="helm-python-sdk (Helm's engine) is not installed: pip install -e '.[dev]'"
)

pytestmark = pytest.mark.timeout(60)

CHART = DEPLOY / "helm/affinity-gateway"
VALUES_FILES = [
    "values.yaml",
    "values-vllm.yaml",
    "values-redis-external.yaml",
    "values-k8s-discovery.yaml",
    "values-vllm-fleet.yaml",
]
KUBE_VERSION = "1.37.0"  # the newest schemas kubernetes-validate ships
RELEASE = "ag"


def render(overrides: dict[str, Any] | None) -> list[dict[str, Any]]:
    """`helm template ag deploy/helm/affinity-gateway -f FILE`: the rendered objects."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(overrides, name=RELEASE, namespace="default", is_install=True)
    return [d for text in manifests.values() for d in yaml.safe_load_all(text) if d]


def values_file(name: str) -> dict[str, Any] | None:
    return None if name == "values.yaml" else yaml.safe_load((CHART / name).read_text())


RENDERED = {name: render(values_file(name)) for name in VALUES_FILES}


def objects(name: str, kind: str) -> list[dict[str, Any]]:
    return [d for d in RENDERED[name] if d["kind"] == kind]


def one(name: str, kind: str, component: str) -> dict[str, Any]:
    (found,) = [d for d in objects(name, kind) if d["metadata"]["labels"]["app.kubernetes.io/component"] == component]
    return found


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return workload["spec"]["template"]["spec"]["containers"]


def replica_workload(name: str) -> dict[str, Any]:
    (workload,) = [
        d
        for d in RENDERED[name]
        if d["kind"] in ("Deployment", "StatefulSet")
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "replica"
    ]
    return workload


def values(name: str) -> dict[str, Any]:
    """values.yaml with the file's values over it (one level deep is enough for the keys read here)."""
    merged = yaml.safe_load((CHART / "values.yaml").read_text())
    for key, value in (values_file(name) or {}).items():
        merged[key] = (
            {**merged[key], **value} if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
        )
    return merged


def stand_in_secrets(data: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """The files the config reads from mounted Secrets (Redis URL, digests, the backend key), written under
    tmp_path with what such a Secret holds, so the gateway's loader can read them."""
    if data.get("redis", {}).get("url_file"):
        (tmp_path / "url").write_text("redis://:secret@redis.example:6379/0")
        data["redis"]["url_file"] = str(tmp_path / "url")
    for i, entry in enumerate(data.get("auth", {}).get("keys", [])):
        (tmp_path / f"digests-{i}").write_text(f"{i:064x}\n")
        entry["sha256_file"] = str(tmp_path / f"digests-{i}")
    for pool in data["pools"].values():
        if "api_key_file" in pool:
            (tmp_path / "backend-key").write_text("sk-backend\n")
            pool["api_key_file"] = str(tmp_path / "backend-key")
    return data


def gateway_yaml(name: str) -> dict[str, Any]:
    return yaml.safe_load(one(name, "ConfigMap", "gateway")["data"]["gateway.yaml"])


@pytest.mark.parametrize("name", VALUES_FILES)
def test_helm_lint_passes_strict(name: str) -> None:
    report = helm.lint(CHART, values_file(name), strict=True, kube_version=f"v{KUBE_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 1 is info ("icon is recommended")
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize("name", VALUES_FILES)
def test_every_manifest_validates_against_the_kubernetes_schemas(name: str) -> None:
    for doc in RENDERED[name]:
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            continue  # a CRD: test_service_monitors_scrape_the_http_port_of_a_service
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)  # strict: unknown fields fail too


@pytest.mark.parametrize("name", VALUES_FILES)
def test_the_gateway_config_loads_and_finds_the_replicas_and_their_kv_events(name: str, tmp_path: Path) -> None:
    data = stand_in_secrets(gateway_yaml(name), tmp_path)
    config = parse_config(data)
    pool = config.pools[values(name)["pool"]["name"]]
    service = one(name, "Service", "replica")
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    if pool.discovery.kubernetes is not None:  # the API: that Service's slices, the port named http
        assert pool.discovery.dns is None and pool.discovery.kubernetes.service == service["metadata"]["name"]
        assert pool.discovery.kubernetes.port_name == "http" and pool.discovery.kubernetes.namespace is None
    else:
        assert service["spec"]["clusterIP"] == "None" and pool.discovery.dns == service["metadata"]["name"]
    assert (pool.discovery.port, pool.discovery.kv_events_port, pool.discovery.kv_events_replay_port) == (
        ports["http"],
        ports["kv-events"],
        ports["kv-replay"],
    )
    assert pool.routing.prefix.tokenizer is not None  # KV events carry token ids


@pytest.mark.parametrize("name", VALUES_FILES)
def test_services_select_one_workload_and_target_its_named_ports(name: str) -> None:
    workloads = [d for d in RENDERED[name] if d["kind"] in ("Deployment", "StatefulSet")]
    for service in objects(name, "Service"):
        selector = service["spec"]["selector"].items()
        (workload,) = [w for w in workloads if selector <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert selector <= workload["spec"]["selector"]["matchLabels"].items()
        declared = {p["name"] for c in containers(workload) for p in c["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= declared


def test_stub_replicas_run_the_replica_stub_with_the_pools_block_size_and_events_ports() -> None:
    workload = replica_workload("values.yaml")
    (c,) = containers(workload)
    args = stub_args(c["args"])
    config = gateway_yaml("values.yaml")
    (pool_name,) = config["pools"]
    pool = config["pools"][pool_name]
    assert workload["kind"] == "Deployment" and args.model == pool_name and args.engine == "sim"
    assert args.block_size == pool["routing"]["prefix"]["block_tokens"]
    assert args.kv_events_endpoint == f"tcp://*:{pool['discovery']['kv_events_port']}"
    assert args.kv_events_replay_endpoint == f"tcp://*:{pool['discovery']['kv_events_replay_port']}"


def test_vllm_replicas_have_gpus_the_flags_the_gateway_needs_and_time_to_load() -> None:
    workload = replica_workload("values-vllm.yaml")
    (c,) = containers(workload)
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] if "=" in a else None for a in c["args"][1:]}
    config = gateway_yaml("values-vllm.yaml")
    (pool_name,) = config["pools"]
    pool = config["pools"][pool_name]
    assert workload["kind"] == "StatefulSet" and c["command"] == ["vllm", "serve"]
    assert {"--enable-prefix-caching", "--enable-prompt-tokens-details"} <= args.keys()
    assert args["--served-model-name"] == pool_name
    assert int(args["--block-size"]) == pool["routing"]["prefix"]["block_tokens"]
    assert pool["routing"]["prefix"]["tokenizer"] == "replica"  # vLLM's own /tokenize
    events = json.loads(args["--kv-events-config"])
    assert events["enable_kv_cache_events"] is True and events["publisher"] == "zmq"
    assert events["endpoint"] == f"tcp://*:{pool['discovery']['kv_events_port']}"
    assert events["replay_endpoint"] == f"tcp://*:{pool['discovery']['kv_events_replay_port']}"
    gpus = c["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus >= 1 and int(args["--tensor-parallel-size"]) == gpus
    probe = c["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 600  # minutes to download and load weights


def test_external_redis_url_comes_from_the_secret_mounted_where_the_config_reads_it() -> None:
    name = "values-redis-external.yaml"
    assert not [d for d in RENDERED[name] if d["metadata"]["labels"]["app.kubernetes.io/component"] == "redis"]
    gateway = one(name, "Deployment", "gateway")
    (c,) = containers(gateway)
    (volume,) = [v for v in gateway["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
    (item,) = volume["secret"]["items"]
    assert volume["secret"]["secretName"] == values_file(name)["externalRedis"]["existingSecret"]
    assert gateway_yaml(name)["redis"] == {"url_file": f"{mount['mountPath']}/{item['path']}"}
    assert gateway_yaml(name)["index"] == {"store": "redis"}


def test_in_chart_redis_is_the_store_by_default() -> None:
    service = one("values.yaml", "Service", "redis")
    assert gateway_yaml("values.yaml")["redis"]["url"] == f"redis://{service['metadata']['name']}:6379/0"
    assert gateway_yaml("values.yaml")["index"]["store"] == "redis"


def test_gateways_autoscale_without_a_fixed_replica_count() -> None:
    (hpa,) = objects("values-vllm.yaml", "HorizontalPodAutoscaler")
    gateway = one("values-vllm.yaml", "Deployment", "gateway")
    assert hpa["spec"]["scaleTargetRef"]["name"] == gateway["metadata"]["name"] and "replicas" not in gateway["spec"]
    assert not objects("values.yaml", "HorizontalPodAutoscaler")


def test_service_monitors_scrape_the_http_port_of_a_service() -> None:
    monitors = objects("values-vllm.yaml", "ServiceMonitor")
    assert len(monitors) == 2 and not objects("values.yaml", "ServiceMonitor")
    for monitor in monitors:
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        selector = monitor["spec"]["selector"]["matchLabels"].items()
        (service,) = [s for s in objects("values-vllm.yaml", "Service") if selector <= s["metadata"]["labels"].items()]
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]} and endpoint["path"] == "/metrics"


def test_a_config_change_rolls_the_gateways() -> None:
    def checksum(overrides: dict[str, Any]) -> str:
        (gateway,) = [
            d
            for d in render(overrides)
            if d["kind"] == "Deployment" and d["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"
        ]
        return str(gateway["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum({}) != checksum({"gateway": {"config": {"logging": {"level": "debug"}}}})


def rbac(objs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {kind: [d for d in objs if d["kind"] == kind] for kind in ("ServiceAccount", "Role", "RoleBinding")}


def pod_spec(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (gateway,) = [
        d
        for d in objs
        if d["kind"] == "Deployment" and d["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"
    ]
    return dict(gateway["spec"]["template"]["spec"])


def test_api_discovery_runs_the_gateways_as_an_account_that_may_only_list_and_watch_endpointslices() -> None:
    objs = RENDERED["values-k8s-discovery.yaml"]
    found = rbac(objs)
    (account,), (role,), (binding,) = found["ServiceAccount"], found["Role"], found["RoleBinding"]
    assert pod_spec(objs)["serviceAccountName"] == account["metadata"]["name"]
    assert (
        account["metadata"]["annotations"] == values_file("values-k8s-discovery.yaml")["serviceAccount"]["annotations"]
    )
    (rule,) = role["rules"]  # nothing but the slices, and only to read them
    assert rule["apiGroups"] == ["discovery.k8s.io"] and rule["resources"] == ["endpointslices"]
    assert {"list", "watch"} <= set(rule["verbs"]) <= {"get", "list", "watch"}
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "default"}
    ]


@pytest.mark.parametrize("name", ["values.yaml", "values-vllm.yaml", "values-redis-external.yaml"])
def test_dns_discovery_has_no_account_no_role_and_no_api_token(name: str) -> None:
    assert not any(rbac(RENDERED[name]).values())
    spec = pod_spec(RENDERED[name])
    assert "serviceAccountName" not in spec and spec["automountServiceAccountToken"] is False


def test_an_existing_account_is_bound_and_rbac_may_be_left_to_the_cluster_admin() -> None:
    objs = render({"discovery": {"mode": "kubernetes"}, "serviceAccount": {"create": False, "name": "gw"}})
    found = rbac(objs)
    assert not found["ServiceAccount"] and pod_spec(objs)["serviceAccountName"] == "gw"
    (binding,) = found["RoleBinding"]
    assert binding["subjects"][0]["name"] == "gw"
    objs = render({"discovery": {"mode": "kubernetes"}, "rbac": {"create": False}})
    assert [d["kind"] for d in objs if d["kind"] in ("ServiceAccount", "Role", "RoleBinding")] == ["ServiceAccount"]
    for doc in objs:
        if doc["apiVersion"] != "monitoring.coreos.com/v1":
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_label_mapping_merges_into_the_generated_kubernetes_discovery() -> None:
    """The chart README's way to map labels to adapters and roles: gateway.config.loader over the generated section."""
    mapping = {"role_label": "affinity-gateway.io/role", "adapter_label_prefix": "adapters.affinity-gateway.io/"}
    overrides = {
        "discovery": {"mode": "kubernetes"},
        "gateway": {"config": {"pools": {"stub-model": {"discovery": {"kubernetes": mapping}}}}},
    }
    (config_map,) = [
        d
        for d in render(overrides)
        if d["kind"] == "ConfigMap" and d["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"
    ]
    (pool,) = parse_config(yaml.safe_load(config_map["data"]["gateway.yaml"])).pools.values()
    assert pool.discovery is not None and pool.discovery.kubernetes is not None
    k8s = pool.discovery.kubernetes
    assert (k8s.service, k8s.port_name, k8s.role_label, k8s.adapter_label_prefix) == (
        f"{RELEASE}-affinity-gateway-replica",
        "http",
        mapping["role_label"],
        mapping["adapter_label_prefix"],
    )


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"discovery": {"mode": "kubernetes"}, "serviceAccount": {"create": False}}, "serviceAccount.name"),
        ({"externalRedis": {"existingSecret": "r"}}, "redis.enabled=false"),
        ({"auth": {"existingSecret": "keys"}}, "auth: set existingSecret and files together"),
        ({"extraPools": [{"name": "stub-model", "service": "s"}]}, "is pool.name already"),
    ],
)
def test_contradictory_values_fail_the_render(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        render(overrides)


def leaf_keys(values: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted keys of values.yaml; a list or an empty map is one value."""
    keys: set[str] = set()
    for key, value in values.items():
        if isinstance(value, dict) and value:
            keys |= leaf_keys(value, f"{prefix}{key}.")
        else:
            keys.add(f"{prefix}{key}")
    return keys


DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())
LEAVES = leaf_keys(DEFAULTS)
DECLARED = {k.rsplit(".", n)[0] for k in LEAVES for n in range(k.count(".") + 1)}  # leaves and their parents


def test_every_value_is_documented_in_the_readme_table() -> None:
    """A row per value; a map such as `resources` may be one row."""
    documented = set(re.findall(r"^\| `([\w.]+)` \|", (CHART / "README.md").read_text(), re.MULTILINE))
    assert documented <= DECLARED, sorted(documented - DECLARED)
    undocumented = {k for k in LEAVES if not any(k == d or k.startswith(f"{d}.") for d in documented)}
    assert not undocumented


def test_templates_read_only_values_that_values_yaml_declares() -> None:
    """Helm renders a misspelt `.Values.x` as empty instead of failing: catch it here."""
    text = "\n".join(p.read_text() for p in (CHART / "templates").iterdir())
    used = set(re.findall(r"\.Values\.([\w.]+)", text))
    assert used and used <= DECLARED, sorted(used - DECLARED)


@pytest.mark.parametrize("name", VALUES_FILES[1:])
def test_values_files_set_only_keys_values_yaml_declares(name: str) -> None:
    """Each key is a value of values.yaml or inside one of its maps (`serviceMonitor.labels.release`)."""
    overrides = values_file(name)
    assert overrides is not None
    unknown = {k for k in leaf_keys(overrides) if not any(k == v or k.startswith(f"{v}.") for v in LEAVES)}
    assert not unknown


def test_the_gateway_reads_its_config_from_the_config_map() -> None:
    gateway = one("values.yaml", "Deployment", "gateway")
    (c,) = containers(gateway)
    volumes = {v["name"]: v for v in gateway["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [m for m in c["volumeMounts"] if "configMap" in volumes[m["name"]]]
    config_path = Path(flag(c["args"], "--config"))
    assert config_path.parent == Path(mount["mountPath"])
    config_map = one("values.yaml", "ConfigMap", "gateway")
    assert volumes[mount["name"]]["configMap"]["name"] == config_map["metadata"]["name"]
    assert config_path.name in config_map["data"]
