"""API keys: hashed in config, constant-time match, tenants, admin routes, open probe routes."""

from __future__ import annotations

import pytest

from gateway.config.features import ApiKeyConfig, AuthConfig
from gateway.config.loader import parse_config
from gateway.edge.auth import authenticate, hash_key
from gateway.errors import AuthenticationError, ConfigError, PermissionDeniedError
from gateway.request.caller import ANONYMOUS

USER, ADMIN = "sk-user", "sk-admin"
CONFIG = AuthConfig(
    keys=(
        ApiKeyConfig(sha256=hash_key(USER), tenant="acme"),
        ApiKeyConfig(sha256=hash_key(ADMIN), tenant="ops", admin=True),
    )
)


def test_no_keys_means_open() -> None:
    assert authenticate(AuthConfig(), "/admin/replicas", {}) is ANONYMOUS


@pytest.mark.parametrize(
    "headers", [{"Authorization": f"Bearer {USER}"}, {"authorization": f"bearer  {USER}"}, {"X-API-Key": USER}]
)
def test_a_configured_key_names_its_tenant(headers: dict[str, str]) -> None:
    from multidict import CIMultiDict

    assert authenticate(CONFIG, "/v1/chat/completions", CIMultiDict(headers)).tenant == "acme"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Basic sk-user"},
        {"Authorization": "Bearer sk-other"},
        {"Authorization": f"Bearer {hash_key(USER)}"},
    ],
)
def test_missing_or_unknown_keys_are_401(headers: dict[str, str]) -> None:
    with pytest.raises(AuthenticationError):
        authenticate(CONFIG, "/v1/completions", headers)


def test_admin_routes_need_an_admin_key_and_probes_are_open() -> None:
    with pytest.raises(PermissionDeniedError):
        authenticate(CONFIG, "/admin/reload", {"Authorization": f"Bearer {USER}"})
    assert authenticate(CONFIG, "/admin/reload", {"Authorization": f"Bearer {ADMIN}"}).key.admin  # type: ignore[union-attr]
    for path in ("/health", "/ready", "/metrics"):
        assert authenticate(CONFIG, path, {}) is ANONYMOUS


@pytest.mark.parametrize(
    ("keys", "where"),
    [
        ([{"sha256": "abc", "tenant": "t"}], "auth.keys[0].sha256"),
        ([{"sha256": hash_key(USER).upper(), "tenant": "t"}], "auth.keys[0].sha256"),
        ([{"sha256": hash_key(USER), "tenant": ""}], "auth.keys[0].tenant"),
        ([{"sha256": hash_key(USER), "tenant": "t", "tokens_per_minute": -1}], "auth.keys[0].tokens_per_minute"),
        ([{"sha256": hash_key(USER), "tenant": "a"}, {"sha256": hash_key(USER), "tenant": "b"}], "auth.keys[1].sha256"),
    ],
)
def test_bad_key_config_names_the_key(keys: list[dict[str, object]], where: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"pools": {"m": {"replicas": [{"url": "http://a:1"}]}}, "auth": {"keys": keys}})
    assert info.value.key == where
