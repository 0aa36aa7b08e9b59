"""Config loading: defaults, validation errors naming file and dotted key, env overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config.loader import load_config
from gateway.errors import ConfigError
from tests.helpers import ROOT

MINIMAL = {"pools": {"m": {"replicas": [{"url": "http://127.0.0.1:9001"}]}}}


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "gw.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_example_config_loads() -> None:
    config = load_config(ROOT / "config.example.yaml")
    assert config.pools["stub-model"].replicas[2].weight == 2.0
    assert config.index.store == "memory"


def test_defaults_and_replica_id(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL))
    assert config.listen.port == 8000 and config.limits.max_retries == 1
    assert config.pools["m"].replicas[0].replica_id == "127.0.0.1:9001"
    assert config.pools["m"].routing.policy == "prefix_affinity"


def pool(**changes: Any) -> dict[str, Any]:
    return {"pools": {"m": {"replicas": [{"url": "http://h:1"}], **changes}}}


@pytest.mark.parametrize(
    ("data", "key", "words"),
    [
        ({**MINIMAL, "listen": {"port": "80"}}, "listen.port", "integer"),
        ({**MINIMAL, "listen": {"port": 70000}}, "listen.port", "65535"),
        ({**MINIMAL, "listen": {"workers": 0}}, "listen.workers", "integer >= 1"),
        ({**MINIMAL, "listen": {"workers": "2"}}, "listen.workers", "integer"),
        ({**MINIMAL, "lsiten": {}}, "lsiten", "unknown key"),
        ({"pools": {}}, "pools", "at least one"),
        ({"pools": {"m": {"replicas": [{"url": "h:1"}]}}}, "pools.m.replicas[0].url", "http"),
        ({"pools": {"m": {"replicas": [{"url": "http://h:1", "weight": 0}]}}}, "pools.m.replicas[0].weight", "> 0"),
        (
            {"pools": {"m": {"replicas": [{"url": "http://h:1"}, {"url": "http://h:1"}]}}},
            "pools.m.replicas[1]",
            "duplicate",
        ),
        ({"pools": {"m": {"replicas": []}}}, "pools.m.replicas", "at least one"),
        (pool(routing={"policy": "fastest"}), "pools.m.routing.policy", "unknown policy"),
        (pool(routing={"policy": "random", "params": {"seed": 1.5}}), "pools.m.routing.params.seed", "integer"),
        ({**MINIMAL, "health": {"interval_s": 0}}, "health.interval_s", "> 0"),
        ({**MINIMAL, "logging": {"level": "loud"}}, "logging.level", "one of"),
        ({**MINIMAL, "redis": {"url": "mysql://x"}}, "redis.url", "redis://"),
        ({**MINIMAL, "redis": {}}, "redis.url", "url or url_file"),
        ({**MINIMAL, "redis": {"url": "redis://r:6379/0", "response_ttl_s": 0}}, "redis.response_ttl_s", "> 0"),
        ({**MINIMAL, "index": {"store": "mysql"}}, "index.store", "one of"),
        ({**MINIMAL, "index": {"store": "redis"}}, "index.store", "top-level `redis`"),
        # The shared Redis was configured under `index` until it was named for what it is:
        # each old key names its new one.
        ({**MINIMAL, "index": {"store": "redis://r:6379/0"}}, "index.store", "`redis.url`"),
        (
            {**MINIMAL, "index": {"redis_url_file": "/run/secrets/redis-url"}},
            "index.redis_url_file",
            "`redis.url_file`",
        ),
        ({**MINIMAL, "index": {"key_prefix": "x:"}}, "index.key_prefix", "`redis.key_prefix`"),
        ({**MINIMAL, "state": {"store": "memory"}}, "state", "under `index` now"),  # the old name of the section
        ({**MINIMAL, "limits": {"max_retries": -1}}, "limits.max_retries", ">= 0"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_errors_name_file_and_key(tmp_path: Path, data: Any, key: str, words: str) -> None:
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == key and info.value.file == str(path)
    assert words in str(info.value) and str(info.value).startswith(f"{path}:{key}: ")


def test_yaml_syntax_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(write(tmp_path, "pools: [unclosed"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")


def test_env_overrides(tmp_path: Path) -> None:
    env = {"AFFINITY_GATEWAY_HOST": "127.0.0.2", "AFFINITY_GATEWAY_PORT": "9100", "AFFINITY_GATEWAY_LOG_LEVEL": "DEBUG"}
    config = load_config(write(tmp_path, MINIMAL), env)
    assert (config.listen.host, config.listen.port, config.logging.level) == ("127.0.0.2", 9100, "debug")
    with pytest.raises(ConfigError, match="AFFINITY_GATEWAY_PORT"):
        load_config(write(tmp_path, MINIMAL), {"AFFINITY_GATEWAY_PORT": "http"})


def test_backend_key_from_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AG_UNIT_KEY", "pool-key")
    key_file = tmp_path / "r.key"
    key_file.write_text(" replica-key\n")
    data = {
        "pools": {
            "m": {
                "api_key_env": "AG_UNIT_KEY",
                "replicas": [
                    {"url": "http://h:1", "name": "a"},
                    {"url": "http://h:2", "name": "b", "api_key_file": str(key_file)},
                ],
            }
        }
    }
    config = load_config(write(tmp_path, data))
    assert config.pools["m"].backend_key("a") == "pool-key"
    assert config.pools["m"].backend_key("b") == "replica-key"
    assert config.pools["m"].backend_key("discovered:8000") == "pool-key"


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"api_key_env": "AG_UNIT_SURELY_UNSET"}, "pools.m.api_key_env"),
        ({"replicas": [{"url": "http://h:1", "api_key_file": "/nonexistent/key"}]}, "pools.m.replicas[0].api_key_file"),
        ({"api_key_env": "AG_UNIT_SURELY_UNSET", "api_key_file": "/x"}, "pools.m.api_key_env"),
    ],
)
def test_backend_key_errors_name_the_key(tmp_path: Path, changes: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, pool(**changes)))
    assert err.value.key == key and key in str(err.value)


def test_a_backend_key_of_two_lines_is_refused_at_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key goes upstream in a header, where a line break would end it and start another."""
    two_lines = tmp_path / "key"
    two_lines.write_text("first\nX-Injected: yes\n")
    monkeypatch.setenv("AG_UNIT_TWO_LINES", "first\rsecond")
    for changes, key in [
        ({"replicas": [{"url": "http://h:1", "api_key_file": str(two_lines)}]}, "pools.m.replicas[0].api_key_file"),
        ({"api_key_env": "AG_UNIT_TWO_LINES"}, "pools.m.api_key_env"),
    ]:
        with pytest.raises(ConfigError, match="more than one line") as err:
            load_config(write(tmp_path, pool(**changes)))
        assert err.value.key == key and "X-Injected" not in str(err.value)  # the secret is not repeated


def test_the_shared_redis_serves_the_index_only_when_it_says_so() -> None:
    from gateway.config.features import IndexStore
    from gateway.config.loader import parse_config

    shared = {"redis": {"url": "redis://r:6379/0", "key_prefix": "x:"}}
    alone = parse_config({**MINIMAL, **shared})
    assert alone.index_store("m") == IndexStore(alone.index)  # quotas and token costs shared, the index in memory
    both = parse_config({**MINIMAL, **shared, "index": {"store": "redis", "mirror": False}})
    assert both.index_store("m") == IndexStore(both.index, "redis://r:6379/0", "x:m:")
