"""deploy/docker-compose.yml, nginx.conf and prometheus.yml, checked without an engine (the dashboard: test_dashboard).

Every gateway service's mounted config must load with the gateway's own loader and its own
environment, and every name and port in it must be a compose service that listens there.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gateway.config.loader import ENV_PREFIX, Config, apply_env, load_config
from replica_stub.config import load_config as load_stub_config
from tests.helpers import ROOT
from tests.unit.deploy.deployfiles import (
    CONFIG_PATH,
    DEPLOY,
    REAL_ENGINE,
    compose,
    compose_gateway_config,
    dockerfile,
    exec_form,
    flag,
    host_port,
    last,
    mounts,
    nginx_directives,
    stub_args,
)

SERVICES = compose()["services"]
GATEWAYS = [name for name, s in SERVICES.items() if s.get("build", {}).get("target") == "gateway"]
REPLICAS = [name for name, s in SERVICES.items() if s.get("build", {}).get("target", "").startswith("replica")]
VLLM = [name for name, s in SERVICES.items() if s.get("image", "").startswith("vllm/")]  # test_compose_vllm


def profiles(name: str) -> set[str]:
    return set(SERVICES[name].get("profiles", ()))


def gateway_config(name: str) -> Config:
    return compose_gateway_config(SERVICES[name])


def replica_listen_port(name: str) -> int:
    args = exec_form(last(dockerfile(), SERVICES[name]["build"]["target"], "CMD") or "[]")
    args = SERVICES[name].get("command", args)
    return int(flag(args, "--port"))


def container_ports(service: dict[str, Any]) -> set[int]:
    return {int(str(p).rsplit(":", 1)[1]) for p in service.get("ports", ())}


def test_the_topology_is_redis_three_replicas_two_gateways_a_front_and_prometheus() -> None:
    default = {name for name in SERVICES if not profiles(name)}
    assert {"redis", "replica-0", "replica-1", "replica-2", "gateway-a", "gateway-b", "front", "prometheus"} <= default
    assert [g for g in GATEWAYS if not profiles(g)] == ["gateway-a", "gateway-b"]
    assert {name for name in SERVICES if profiles(name)} == {
        "real-replica-0",
        "real-replica-1",
        "gateway-real",
        "vllm-replica-0",
        "vllm-replica-1",
        "gateway-vllm",
    }
    assert all(profiles(name) == {"real"} for name in ("real-replica-0", "real-replica-1", "gateway-real"))
    assert all(profiles(name) == {"vllm"} for name in ("vllm-replica-0", "vllm-replica-1", "gateway-vllm"))


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_dependencies_exist_and_are_started_with_their_dependants(name: str) -> None:
    depends = SERVICES[name].get("depends_on", ())
    for dependency in depends:
        assert dependency in SERVICES, f"{name} depends on unknown service {dependency}"
        assert profiles(dependency) <= profiles(name), f"{name} would start without {dependency}"
        if isinstance(depends, dict) and depends[dependency].get("condition") == "service_healthy":
            image_check = "build" in SERVICES[dependency]  # our images carry a HEALTHCHECK
            assert image_check or "healthcheck" in SERVICES[dependency], f"{dependency} has no health check"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_builds_and_bind_mounts_point_into_the_repository(name: str) -> None:
    service = SERVICES[name]
    if "build" in service:
        build = service["build"]
        context = (DEPLOY / build["context"]).resolve()
        assert context == ROOT
        assert (context / build["dockerfile"]).is_file()
        assert build["target"] in dockerfile(context / build["dockerfile"])
    for source in mounts(service).values():
        assert (DEPLOY / source).exists(), f"{name} mounts missing {source}"


@pytest.mark.parametrize("name", GATEWAYS)
def test_gateway_config_loads_and_names_only_services_that_listen_there(name: str) -> None:
    service = SERVICES[name]
    assert exec_form(last(dockerfile(), "gateway", "CMD") or "")[-1] == CONFIG_PATH  # the mount is what runs
    config = gateway_config(name)
    assert config.listen.host == "0.0.0.0" and config.listen.port in container_ports(service)
    depends = set(service["depends_on"])
    for model, pool in config.pools.items():
        assert pool.replicas and pool.discovery is None  # compose has no headless-Service DNS
        for replica in pool.replicas:
            host, port = host_port(replica.url, 80)
            assert host in SERVICES and host in depends
            if host in VLLM:
                continue  # vLLM's flags, not the stub's: test_compose_vllm
            assert host in REPLICAS
            command = SERVICES[host]["command"]
            assert port == replica_listen_port(host)
            assert flag(command, "--model") == model and flag(command, "--replica-id") == replica.name
            if replica.kv_events is not None:  # it subscribes where that replica publishes
                for field, option in (
                    ("endpoint", "--kv-events-endpoint"),
                    ("replay_endpoint", "--kv-events-replay-endpoint"),
                ):
                    host_of, port_of = host_port(getattr(replica.kv_events, field).replace("tcp://", "http://"), 0)
                    assert host_of == host and flag(command, option) == f"tcp://*:{port_of}"
                assert pool.routing.prefix.tokenizer is not None
    drain_s = config.shutdown.ready_delay_s + config.shutdown.grace_s + 1  # + the cut-off (lifecycle.CUT_S)
    assert _seconds(service["stop_grace_period"]) > drain_s  # docker's SIGKILL comes after the drain
    assert (
        config.index.store == "redis" and config.redis is not None and config.redis.resolved_url.startswith("redis://")
    )
    host, port = host_port(config.redis.resolved_url, 6379)
    assert host == "redis" and host in depends and "--port" not in SERVICES["redis"]["command"] and port == 6379
    same_pools = [gateway_config(g) for g in GATEWAYS if _replicas(gateway_config(g)) == _replicas(config)]
    assert len({c.index for c in same_pools}) == 1  # gateways of one pool (the same replicas) share one table


@pytest.mark.parametrize("name", GATEWAYS)
def test_every_environment_value_is_one_the_gateway_reads(name: str) -> None:
    environment = {k: str(v) for k, v in SERVICES[name]["environment"].items()}
    base = load_config(DEPLOY / mounts(SERVICES[name])[CONFIG_PATH], env={})
    for key, value in environment.items():
        assert key.startswith(ENV_PREFIX)
        probe = (
            "1" if key.endswith("PORT") else "2" if key.endswith("WORKERS") else "warning" if "LEVEL" in key else "h"
        )
        changed = apply_env(base, {key: probe})
        assert changed != base, f"{key} is not read by the gateway"
        apply_env(base, {key: value})  # and the value itself is valid (ConfigError otherwise)


@pytest.mark.parametrize("name", REPLICAS)
def test_replica_commands_parse_with_the_stub_cli(name: str) -> None:
    command = SERVICES[name]["command"]
    engine = flag(command, "--engine")
    args = stub_args(command)
    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "config") and v is not None}
    config = load_stub_config(None, overrides)
    assert config.host == "0.0.0.0" and config.port in (8000,)
    assert SERVICES[name]["build"]["target"] == ("replica-real" if engine == REAL_ENGINE else "replica")


def test_nginx_round_robins_over_the_gateways_without_buffering_or_cutting_them_short() -> None:
    directives = nginx_directives((DEPLOY / "nginx.conf").read_text())
    values = {name: args for name, args in directives}
    upstream = sorted(args[0] for name, args in directives if name == "server" and args)  # not `server {`
    default_gateways = [g for g in GATEWAYS if not profiles(g)]
    assert upstream == sorted(f"{g}:{gateway_config(g).listen.port}" for g in default_gateways)
    assert not {"least_conn", "ip_hash", "hash"} & set(values)  # plain round robin
    assert int(values["listen"][0]) in container_ports(SERVICES["front"])
    assert mounts(SERVICES["front"])["/etc/nginx/nginx.conf"] == "./nginx.conf"
    assert set(SERVICES["front"]["depends_on"]) == set(default_gateways)
    config = gateway_config("gateway-a")
    assert values["proxy_buffering"] == ["off"]
    assert _size(values["client_max_body_size"][0]) >= config.limits.max_body_bytes
    assert _seconds(values["proxy_read_timeout"][0]) >= config.timeouts.first_byte_s


def test_prometheus_scrapes_every_gateway_and_replica_where_they_listen() -> None:
    scrape = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = {t for job in scrape["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    expected = {f"{g}:{gateway_config(g).listen.port}" for g in GATEWAYS}
    expected |= {f"{r}:{replica_listen_port(r)}" for r in REPLICAS}
    expected |= {f"{r}:{flag(SERVICES[r]['command'], '--port')}" for r in VLLM}
    assert targets == expected
    assert all(job["metrics_path"] == "/metrics" for job in scrape["scrape_configs"])
    assert mounts(SERVICES["prometheus"])["/etc/prometheus/prometheus.yml"] == "./prometheus.yml"
    assert [mounts(SERVICES["prometheus"])[path] for path in scrape["rule_files"]] == ["./prometheus/alerts.yaml"]


def _replicas(config: Config) -> dict[str, set[str]]:
    return {model: {r.url for r in pool.replicas} for model, pool in config.pools.items()}


def _size(text: str) -> int:
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    return int(text[:-1]) * units[text[-1].lower()] if text[-1].lower() in units else int(text)


def _seconds(text: str) -> float:
    return float(text[:-1]) * {"s": 1, "m": 60}[text[-1]] if text[-1] in "sm" else float(text)
