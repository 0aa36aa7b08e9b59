"""Model aliases, wildcard patterns and the default pool (gateway.routing.model_names), from YAML."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config.loader import parse_config
from gateway.config.model_names import exact_aliases
from gateway.errors import ConfigError
from gateway.routing.model_names import renamed
from gateway.view import RequestView

pytestmark = pytest.mark.timeout(10)


def config(routes: dict[str, Any] | None = None, **aliases: list[str]) -> Any:
    pools = {
        name: {"replicas": [{"url": f"http://h{i}:1"}], "aliases": names}
        for i, (name, names) in enumerate(aliases.items())
    }
    return parse_config({"pools": pools, **({"routes": routes} if routes else {})})


def test_exact_names_win_then_patterns_in_pool_order_then_the_default() -> None:
    names = config({"default_pool": "big"}, small=["gpt-4o-mini", "smol-*"], big=["gpt-4*", "smol-large"]).model_names
    assert names.pool_for("small") == "small" and names.pool_for("big") == "big"
    assert names.pool_for("gpt-4o-mini") == "small"  # exact, though big's pattern matches it too
    assert names.pool_for("gpt-4o") == "big"
    assert names.pool_for("smol-large") == "big"  # exact beats small's earlier pattern
    assert names.pool_for("smol-tiny") == "small"
    assert names.pool_for("anything-else") == "big"


def test_without_a_default_an_unknown_name_names_no_pool() -> None:
    assert config(small=["a*"]).model_names.pool_for("b") is None


@pytest.mark.parametrize(
    ("aliases", "routes", "key", "words"),
    [
        ({"a": ["x"], "b": ["x"]}, None, "pools.b.aliases[0]", "an alias of pool 'a'"),
        ({"a": ["b"], "b": []}, None, "pools.a.aliases[0]", "pool 'b'"),
        ({"a": [""]}, None, "pools.a.aliases[0]", "non-empty"),
        ({"a": []}, {"default_pool": "c"}, "routes.default_pool", "no pool named 'c'"),
    ],
)
def test_a_name_that_is_taken_or_a_missing_default_is_an_error_naming_the_key(
    aliases: dict[str, list[str]], routes: dict[str, Any] | None, key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as err:
        config(routes, **aliases)
    assert err.value.key == key and words in err.value.reason


def test_a_renamed_request_goes_on_under_the_pool_name_and_only_patterns_stay_unlisted() -> None:
    view = RequestView(
        "r", "chat", "gpt-4o", False, {"model": "gpt-4o", "messages": [], "temperature": 0.5}, b'{"model":"gpt-4o"}'
    )
    renamed(view, "small")
    assert view.model == "small" and view.raw == b'{"model":"small","messages":[],"temperature":0.5}'
    assert exact_aliases(["a", "b-*", "c?", "[de]", "f"]) == ["a", "f"]
