"""`${VAR}` interpolation, `check` and the config-free `serve` flags."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.cli.main import main
from gateway.config.env import MASK, interpolate
from gateway.config.loader import load_config
from gateway.errors import ConfigError

pytestmark = pytest.mark.timeout(30)
ENV = {"HOST": "10.0.0.5", "PASS": "s3cret", "EMPTY": ""}


def test_interpolation_in_values_with_defaults_and_escapes() -> None:
    data = {"a": "http://${HOST}:8000", "b": ["${MISSING:-x}", "$${HOST}"], "c": 3, "d": "${EMPTY}"}
    assert interpolate(data, ENV) == {"a": "http://10.0.0.5:8000", "b": ["x", "${HOST}"], "c": 3, "d": ""}


@pytest.mark.parametrize(("data", "key"), [
    ({"pools": {"m": {"replicas": [{"url": "http://${NOPE}:1"}]}}}, "pools.m.replicas[0].url"),
    ({"redis": {"url": "redis://${PASS"}}, "redis.url"),
])
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


def test_check_prints_the_resolved_config_with_secrets_masked(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AG_CHECK_PASS", "hunter2")
    monkeypatch.setenv("AG_CHECK_HOST", "10.1.2.3")
    path = tmp_path / "gw.yaml"
    path.write_text("pools: {m: {replicas: [{url: 'http://${AG_CHECK_HOST}:1'}]}}\n"
                    "redis: {url: 'redis://:${AG_CHECK_PASS}@redis:6379/0'}\n")
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "hunter2" not in out and "10.1.2.3" not in out
    printed = yaml.safe_load(out)
    assert printed["redis"]["url"] == MASK and printed["pools"]["m"]["replicas"][0]["url"] == MASK
    assert printed["listen"]["port"] == 8000 and printed["pools"]["m"]["routing"]["policy"] == "prefix_affinity"


def test_check_of_a_literal_url_password_masks_only_the_password(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text("pools: {m: {replicas: [{url: 'http://h:1'}]}}\nredis: {url: 'redis://u:pw@redis:6379/0'}\n")
    assert main(["check", str(path)]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["redis"]["url"] == f"redis://u:{MASK}@redis:6379/0"


def test_check_of_a_bad_file_exits_1_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("pools: {m: {replicas: [{url: 'http://h:1'}], routing: {polcy: x}}}\n")
    assert main(["check", str(path)]) == 1
    assert f"{path}:pools.m.routing.polcy: unknown key" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["serve"], "--replica: needs --config FILE"),
    (["serve", "--replica", "http://h:1"], "--model: needs --config FILE"),
    (["serve", "--replica", "h:1", "--model", "m"], "pools.m.replicas[0].url: expected an http(s) URL"),
    (["serve", "--replica", "http://h:1", "--model", "m", "--policy", "nope"], "pools.m.routing"),
])
def test_serve_flags_errors_name_the_flag_or_key(argv: list[str], message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err
