"""CLI argument handling and the `up` cluster's generated config."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gateway.cli.main import main
from gateway.config.loader import parse_config
from lab.cluster import ClusterSpec, build_config
from lab.vllm_replica import VLLMReplica


def test_serve_with_bad_config_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("pools: {m: {replicas: [{url: 'http://h:1', wieght: 2}]}}\n")
    assert main(["serve", "--config", str(path)]) == 2
    assert f"{path}:pools.m.replicas[0].wieght: unknown key" in capsys.readouterr().err


def test_subcommand_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([])
    assert "serve" in capsys.readouterr().err


def test_up_generates_a_valid_config() -> None:
    data = build_config(ClusterSpec(replicas=2, port=8123, policy="least_loaded"), [9001, 9002])
    config = parse_config(data)
    pool = config.pools["stub-model"]
    assert [r.url for r in pool.replicas] == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    assert pool.routing.policy == "least_loaded" and config.listen.port == 8123


def test_up_config_subscribes_to_each_replicas_events_with_the_matching_tokenizer_and_params() -> None:
    spec = ClusterSpec(replicas=2, policy="prefix_affinity", policy_params={"load_epsilon": 0.5})
    config = parse_config(build_config(spec, [9001, 9002], event_ports=[(7001, 7002), (7003, 7004)]))
    pool = config.pools["stub-model"]
    assert [(r.kv_events.endpoint, r.kv_events.replay_endpoint) for r in pool.replicas if r.kv_events] == [
        ("tcp://127.0.0.1:7001", "tcp://127.0.0.1:7002"),
        ("tcp://127.0.0.1:7003", "tcp://127.0.0.1:7004"),
    ]
    assert pool.routing.prefix.tokenizer == "sim" and pool.routing.params == {"load_epsilon": 0.5}
    real = parse_config(build_config(dataclasses.replace(spec, engine="real"), [9001], event_ports=[(7001, 7002)]))
    assert real.pools["stub-model"].routing.prefix.tokenizer == "model:smollm2"


def test_policy_params_are_yaml_scalars_checked_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [
        "simulate",
        "-w",
        "hot-prefix",
        "-p",
        "requests=20",
        "--policies",
        "prefix_affinity",
        "-q",
        "--no-plots",
        "--out",
        str(tmp_path),
    ]
    assert main([*base, "-P", "prefix_affinity.min_bound_requests=abc"]) == 2
    assert "min_bound_requests: expected an integer" in capsys.readouterr().out
    assert main([*base, "-P", "prefix_affinity.min_bound_requests=2", "-P", "prefix_affinity.load_epsilon=0.5"]) == 0
    meta = json.loads((tmp_path / "result.json").read_text())["meta"]
    assert meta["effective_policy_params"]["prefix_affinity"]["min_bound_requests"] == 2


def test_up_vllm_config_connects_to_each_replicas_events_with_its_block_size(tmp_path: Path) -> None:
    spec = ClusterSpec(replicas=2, engine="vllm", model="smollm2")
    replicas = [VLLMReplica(i, 9001 + i, 7001 + 2 * i, 7002 + 2 * i, tmp_path, wildcard=True) for i in range(2)]
    config = parse_config(build_config(spec, [9001, 9002], kv_events=[r.kv_events() for r in replicas]))
    pool = config.pools["smollm2"]
    assert [r.kv_events.endpoint for r in pool.replicas if r.kv_events] == [
        "tcp://127.0.0.1:7001",
        "tcp://127.0.0.1:7003",
    ]
    assert pool.routing.prefix.block_tokens == 128 and pool.routing.prefix.tokenizer == "model:smollm2"
    events = json.loads(replicas[0].command()[replicas[0].command().index("--kv-events-config") + 1])
    assert events["endpoint"] == "tcp://*:7001"  # vLLM binds only wildcard endpoints, connects to the rest


def test_vllm_replica_outside_a_loopback_namespace_uses_ipc_sockets(tmp_path: Path) -> None:
    replica = VLLMReplica(0, 9001, 7001, 7002, tmp_path, wildcard=False)
    assert replica.kv_events()["endpoint"] == f"ipc://{tmp_path}/vllm-0-events"
    command = replica.command()
    assert "--enable-prompt-tokens-details" in command and "--enforce-eager" in command
    assert command[command.index("--dtype") + 1] in ("float32", "bfloat16")
    assert replica.env()["VLLM_CPU_OMP_THREADS_BIND"] == "0" and replica.env()["HF_HUB_OFFLINE"] == "1"
