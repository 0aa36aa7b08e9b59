"""`${VAR}` interpolation, `check` and the config-free `serve` flags."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.cli.main import main
from gateway.config.env import MASK, interpolate
from gateway.config.loader import load_config, parse_config
from gateway.errors import ConfigError
from tests.helpers import ROOT

pytestmark = pytest.mark.timeout(30)
ENV = {"HOST": "10.0.0.5", "PASS": "s3cret", "EMPTY": ""}


def test_interpolation_in_values_with_defaults_and_escapes() -> None:
    data = {"a": "http://${HOST}:8000", "b": ["${MISSING:-x}", "$${HOST}"], "c": 3, "d": "${EMPTY}"}
    assert interpolate(data, ENV) == {"a": "http://10.0.0.5:8000", "b": ["x", "${HOST}"], "c": 3, "d": ""}


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"pools": {"m": {"replicas": [{"url": "http://${NOPE}:1"}]}}}, "pools.m.replicas[0].url"),
        ({"redis": {"url": "redis://${PASS"}}, "redis.url"),
    ],
)
def test_a_missing_or_malformed_variable_names_the_key(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        interpolate(data, ENV)
    assert err.value.key == key


def test_load_config_interpolates_and_names_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text("pools: {m: {replicas: [{url: 'http://${HOST}:1'}]}}\n")
    assert load_config(path, ENV).pools["m"].replicas[0].url == "http://10.0.0.5:1"
    with pytest.raises(ConfigError) as err:
        load_config(path, {})
    assert str(err.value).startswith(f"{path}:pools.m.replicas[0].url: environment variable 'HOST' is not set")


def test_check_prints_the_resolved_config_with_secrets_masked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AG_CHECK_PASS", "hunter2")
    monkeypatch.setenv("AG_CHECK_HOST", "10.1.2.3")
    path = tmp_path / "gw.yaml"
    path.write_text(
        "pools: {m: {replicas: [{url: 'http://${AG_CHECK_HOST}:1'}]}}\n"
        "redis: {url: 'redis://:${AG_CHECK_PASS}@redis:6379/0'}\n"
    )
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "hunter2" not in out and "10.1.2.3" not in out
    printed = yaml.safe_load(out)
    assert printed["redis"]["url"] == MASK and printed["pools"]["m"]["replicas"][0]["url"] == MASK
    assert printed["listen"]["port"] == 8000 and printed["pools"]["m"]["routing"]["policy"] == "prefix_affinity"


def test_check_of_a_literal_url_password_masks_only_the_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text("pools: {m: {replicas: [{url: 'http://h:1'}]}}\nredis: {url: 'redis://u:pw@redis:6379/0'}\n")
    assert main(["check", str(path)]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["redis"]["url"] == f"redis://u:{MASK}@redis:6379/0"


def test_check_of_a_bad_file_exits_1_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("pools: {m: {replicas: [{url: 'http://h:1'}], routing: {polcy: x}}}\n")
    assert main(["check", str(path)]) == 1
    assert f"{path}:pools.m.routing.polcy: unknown key" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve"], "--replica: needs --config FILE"),
        (["serve", "--replica", "http://h:1"], "--model: needs --config FILE"),
        (
            ["serve", "--replica", "http://h:1", "--replica", "h:2", "--model", "m"],
            "config error: --replica h:2: expected an http(s) URL",
        ),
    ],
)
def test_serve_flags_errors_name_the_flag(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "pools." not in err  # the flag the user gave, not a file's key


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("nope", "unknown policy 'nope' (known: consistent_hash"),
        ("cache_aware", "'cache_aware' is another router's name: write 'prefix_affinity'"),
        ("prefix-affinity", "did you mean 'prefix_affinity'?"),
    ],
)
def test_an_unknown_policy_flag_is_refused_with_the_name_to_write(
    policy: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--replica", "http://h:1", "--model", "m", "--policy", policy])
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_check_reports_every_mistake_at_once_with_its_key_and_the_nearest_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "three.yaml"
    path.write_text(
        "pool: {}\nlisten: {host: 1}\n"
        "pools: {m: {replicas: [{url: 'http://h:1'}], routing: {policy: prefix-affinity}}}\n"
    )
    assert main(["check", str(path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "affinity-gateway: 3 config errors:"
    assert any(f"{path}:pool: unknown key; did you mean 'pools'?" in line for line in lines)
    assert any(
        f"{path}:pools.m.routing.policy: unknown policy 'prefix-affinity'; did you mean 'prefix_affinity'?" in line
        for line in lines
    )
    assert any(f"{path}:listen.host: expected a string" in line for line in lines)


@pytest.mark.parametrize(("env", "port", "enabled"), [({}, 8000, True), ({"PORT": "9001", "ON": "off"}, 9001, False)])
def test_a_variable_gives_numbers_and_booleans_too(env: dict[str, str], port: int, enabled: bool) -> None:
    config = parse_config(
        interpolate(
            {
                "listen": {"port": "${PORT:-8000}"},
                "metrics": {"enabled": "${ON:-true}"},
                "pools": {"m": {"replicas": [{"url": "http://h:1"}]}},
            },
            env,
        )
    )
    assert config.listen.port == port and type(config.listen.port) is int and config.metrics.enabled is enabled


def test_a_variable_that_is_no_number_is_an_error_naming_the_key() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(
            interpolate(
                {"listen": {"port": "${PORT}"}, "pools": {"m": {"replicas": [{"url": "http://h:1"}]}}},
                {"PORT": "eighty"},
            )
        )
    assert raised.value.key == "listen.port" and "expected an integer from the environment, got 'eighty'" in str(
        raised.value
    )


def test_check_prints_the_policy_parameters_it_runs_with(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("pools: {m: {replicas: [{url: 'http://h:1'}]}}\n")
    assert main(["check", str(path)]) == 0
    params = yaml.safe_load(capsys.readouterr().out)["pools"]["m"]["routing"]["params"]
    assert params["bound_margin"] is not None and "prefill_s_per_token" in params  # the defaults, not {}


def test_check_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("pools: {m: {replicas: [{url: 'http://h:1'}]}}\n")
    piped = subprocess.run(
        f"{sys.executable} -m gateway check {path} | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=25,
        cwd=ROOT,
    )
    assert piped.stdout.startswith("# ") and "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr


def test_serve_reads_the_config_file_the_environment_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "named.yaml"
    path.write_text("pools: {m: {replicas: [{url: 'h:1'}]}}\n")
    monkeypatch.setenv("AFFINITY_GATEWAY_CONFIG", str(path))
    assert main(["serve"]) == 2  # it read the named file, whose replica URL is wrong
    assert f"{path}:pools.m.replicas[0].url" in capsys.readouterr().err


def test_serve_help_shows_the_defaults_and_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # as read, whatever argparse's line breaks
    assert "default: prefix_affinity" in out and "default: listen.port, 8000" in out and "examples:" in out
    assert "{consistent_hash,least_loaded,power_of_two,prefix_affinity" in out


def test_opentelemetry_variables_set_the_tracing_endpoint_service_and_sampler() -> None:
    data = {"tracing": {"endpoint": "http://file:4318"}, "pools": {"m": {"replicas": [{"url": "http://h:1"}]}}}
    tracing = parse_config(
        data,
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318",
            "OTEL_SERVICE_NAME": "gw-eu",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.25",
        },
    ).tracing
    assert (tracing.endpoint, tracing.service_name, tracing.sampling_ratio) == ("http://otel:4318", "gw-eu", 0.25)
    assert parse_config(data, {}).tracing.endpoint == "http://file:4318"  # no variable: the file's
    with pytest.raises(ConfigError) as raised:
        parse_config(data, {"OTEL_TRACES_SAMPLER": "jaeger_remote"})
    assert raised.value.key == "env OTEL_TRACES_SAMPLER"


def test_any_key_can_be_set_by_a_variable_one_double_underscore_per_level() -> None:
    data = {"pools": {"llama": {"replicas": [{"url": "http://h:1"}]}}, "limits": {"max_body_bytes": 100}}
    env = {
        "AFFINITY_GATEWAY__LIMITS__MAX_BODY_BYTES": "2048",
        "AFFINITY_GATEWAY__POOLS__LLAMA__ROUTING__POLICY": "round_robin",
        "AFFINITY_GATEWAY__METRICS__ENABLED": "false",
    }
    config = parse_config(data, env)
    assert config.limits.max_body_bytes == 2048 and config.pools["llama"].routing.policy == "round_robin"
    assert config.metrics.enabled is False and data["limits"] == {"max_body_bytes": 100}  # the file's data untouched
    with pytest.raises(ConfigError) as raised:
        parse_config(data, {"AFFINITY_GATEWAY__LIMITS__MAX_BODY_BYTEZ": "1"})
    assert raised.value.key == "limits.max_body_bytez" and "did you mean 'max_body_bytes'?" in str(raised.value)
    with pytest.raises(ConfigError) as raised:
        parse_config(data, {"AFFINITY_GATEWAY__LIMITS__MAX_BODY_BYTES__X": "1"})
    assert raised.value.key == "env AFFINITY_GATEWAY__LIMITS__MAX_BODY_BYTES__X"


def test_every_mistaken_variable_is_reported_at_once_naming_the_variable() -> None:
    data = {"pools": {"m": {"replicas": [{"url": "http://h:1"}]}}}
    with pytest.raises(ConfigError) as raised:
        parse_config(data, {"AFFINITY_GATEWAY_PORT": "x", "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"})
    assert [one.key for one in raised.value.each] == ["env AFFINITY_GATEWAY_PORT", "env OTEL_EXPORTER_OTLP_ENDPOINT"]
