"""`serve --workers N` without processes: the merged /metrics, the restart backoff, the option's checks and
which worker subscribes to the replicas' KV events."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.cli.main import main
from gateway.config.loader import parse_config
from gateway.errors import ConfigError
from gateway.index.kv_events.relay import Sharing
from gateway.observability.metrics import Metrics
from gateway.serving.app import ROUTE_TABLE, make_app
from gateway.serving.workers import SupervisorPolicy, WorkerSpec, attach, merge
from lab.cluster import ClusterSpec, gateway_command

POOLS = {"pools": {"m": {"replicas": [{"url": "http://127.0.0.1:9001"}]}}}


def _worker_body(requests: int) -> bytes:
    metrics = Metrics()
    metrics.requests.labels("m", "r0", "200").inc(requests)
    metrics.ttft.labels("m").observe(0.01)
    return metrics.render()


def test_merge_labels_every_sample_with_its_worker_and_lists_each_family_once() -> None:
    text = merge({0: _worker_body(3), 1: _worker_body(5), 2: None}).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert text.count("# TYPE affinity_gateway_requests_total counter") == 1
    requests = {
        s.labels["worker"]: s.value for s in families["affinity_gateway_requests"].samples if s.name.endswith("_total")
    }
    assert requests == {"0": 3.0, "1": 5.0}
    up = {s.labels["worker"]: s.value for s in families["affinity_gateway_worker_up"].samples}
    assert up == {"0": 1.0, "1": 1.0, "2": 0.0}  # worker 2 did not answer: reported, not hidden
    buckets = [s for s in families["affinity_gateway_ttft_seconds"].samples if s.name.endswith("_count")]
    assert sorted(s.labels["worker"] for s in buckets) == ["0", "1"]


def test_worker_0_alone_subscribes_to_the_kv_events_and_a_lone_gateway_relays_nothing() -> None:
    config = parse_config(POOLS)
    assert make_app(config)[ROUTE_TABLE].kv_feeds.sharing is None  # one process: no forwarder, no relay
    shared = [
        attach(make_app(config), WorkerSpec(i, 3, "affinity-gateway-42"))[ROUTE_TABLE].kv_feeds.sharing
        for i in range(3)
    ]
    assert shared == [Sharing("affinity-gateway-42", owner=i == 0) for i in range(3)]


def test_backoff_doubles_per_recent_exit_up_to_its_cap() -> None:
    policy = SupervisorPolicy(backoff_s=0.5, backoff_max_s=3.0)
    assert [policy.delay(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_each_worker_has_its_own_abstract_socket_named_by_its_supervisor() -> None:
    spec = WorkerSpec(1, 2, "affinity-gateway-42")
    assert spec.socket() == "\0affinity-gateway-42-worker-1" and spec.socket(0) == "\0affinity-gateway-42-worker-0"


@pytest.mark.parametrize(
    ("value", "words"),
    [("0", "must be an integer >= 1, got 0"), ("two", "expected an integer from the environment, got 'two'")],
)
def test_env_workers_is_checked_and_named(value: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(POOLS, {"AFFINITY_GATEWAY_WORKERS": value})
    assert info.value.key == "env AFFINITY_GATEWAY_WORKERS" and words in str(info.value)


def test_env_workers_overrides_the_file() -> None:
    assert parse_config({**POOLS, "listen": {"workers": 4}}, {"AFFINITY_GATEWAY_WORKERS": "2"}).listen.workers == 2
    assert parse_config(POOLS).listen.workers == 1


@pytest.mark.parametrize("command", ["serve", "up"])
@pytest.mark.parametrize("value", ["0", "-1", "x"])
def test_workers_flag_must_be_an_integer_of_at_least_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, value: str
) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(POOLS))
    with pytest.raises(SystemExit) as info:
        main([command, *(["--config", str(path)] if command == "serve" else []), "--workers", value])
    assert info.value.code == 2
    assert "argument --workers: must be an integer >= 1" in capsys.readouterr().err


def test_serve_reports_a_bad_env_workers_as_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(POOLS))
    monkeypatch.setenv("AFFINITY_GATEWAY_WORKERS", "0")
    assert main(["serve", "--config", str(path)]) == 2
    assert "env AFFINITY_GATEWAY_WORKERS: must be an integer >= 1, got 0" in capsys.readouterr().err


def test_up_passes_workers_to_every_gateway() -> None:
    command = gateway_command(ClusterSpec(port=8100, workers=3), "/tmp/g.yaml", 1)
    assert command[-6:] == ["--config", "/tmp/g.yaml", "--port", "8101", "--workers", "3"]


def test_workers_without_a_config_file_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor starts its workers on the file; a config-free start has none to give them."""
    monkeypatch.setenv("AFFINITY_GATEWAY_WORKERS", "1")  # undone after the test, as serve sets it from the flag
    assert main(["serve", "--replica", "http://127.0.0.1:9001", "--model", "m", "--workers", "2"]) == 2
    assert "--workers above 1 needs --config" in capsys.readouterr().err
