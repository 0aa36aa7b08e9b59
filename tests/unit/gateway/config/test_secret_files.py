"""`*_file:` secrets and `${VAR}`: they load, name the key when wrong, and never show in a log or an answer.

A Kubernetes Secret mounts as a file (`redis.url_file`, `auth.keys[].sha256_file`,
`pools.<m>.api_key_file`) or an environment variable (`${REDIS_URL}`); either way the value must
reach Redis, the replica and the key check, and nothing else.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gateway.cli.main import main
from gateway.config.loader import load_config
from gateway.edge.auth import authenticate, hash_key
from gateway.errors import AuthenticationError, ConfigError
from gateway.index.redis_store import RedisIndex
from gateway.log import setup_logging
from gateway.observability.routing_metrics import RoutingMetrics
from gateway.routing.route_table import RouteTable
from gateway.serving.app import make_app
from tests.helpers import free_port
from tests.upstream import FakeReplica, until

pytestmark = pytest.mark.timeout(30)
MODEL = "m"
MINIMAL = {"pools": {MODEL: {"replicas": [{"url": "http://h:1"}]}}}


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def config_file(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_redis_url_file_is_the_shared_redis_and_each_pool_gets_it_resolved(tmp_path: Path) -> None:
    url = "redis://:pw@redis:6379/0"
    data = {**MINIMAL, "redis": {"url_file": write(tmp_path, "redis-url", f"{url}\n")}, "index": {"store": "redis"}}
    config = load_config(config_file(tmp_path, data), env={})
    assert config.redis is not None and config.redis.resolved_url == url
    assert config.index_store(MODEL).url == url and config.index_store(MODEL).key_prefix == f"affinity:{MODEL}:"


async def test_a_reload_reads_a_rotated_redis_url_file_and_rebuilds_the_index(tmp_path: Path) -> None:
    url_file = write(tmp_path, "redis-url", "redis://:old@127.0.0.1:1/0")
    path = config_file(tmp_path, {**MINIMAL, "redis": {"url_file": url_file}, "index": {"store": "redis"}})
    state = RouteTable(load_config(path, env={}), path, RoutingMetrics(CollectorRegistry()))
    await state.start()
    try:
        old = state.routes[MODEL].router
        await state.reload()
        assert state.routes[MODEL].router is old  # same file, same content: the index stays
        write(tmp_path, "redis-url", "redis://:new@127.0.0.1:1/0")
        await state.reload()
        index = state.routes[MODEL].router.index
        assert isinstance(index, RedisIndex) and index.store.url == "redis://:new@127.0.0.1:1/0"
    finally:
        await state.close()


@pytest.mark.parametrize(
    "redis,key,words",
    [
        ({"url_file": "/nonexistent/redis-url"}, "redis.url_file", "cannot read file"),
        ({"url_file": "EMPTY"}, "redis.url_file", "is empty"),
        ({"url_file": "NOT_A_URL"}, "redis.url_file", "must hold a redis://"),
        ({"url_file": "NOT_A_URL", "url": "redis://r:6379/0"}, "redis.url", "one of them"),
    ],
)
def test_a_bad_redis_url_file_is_an_error_naming_the_key_not_the_content(
    tmp_path: Path, redis: dict[str, str], key: str, words: str
) -> None:
    files = {"EMPTY": write(tmp_path, "empty", "\n"), "NOT_A_URL": write(tmp_path, "bad", "mysql://:pw-123@db\n")}
    redis = {k: files.get(v, v) for k, v in redis.items()}
    with pytest.raises(ConfigError) as err:
        load_config(config_file(tmp_path, {**MINIMAL, "redis": redis}), env={})
    assert err.value.key == key and words in str(err.value) and "pw-123" not in str(err.value)


def test_a_sha256_file_holds_one_key_a_line_each_of_the_entrys_tenant(tmp_path: Path) -> None:
    old, new, ops = "old-key", "new-key", "ops-key"
    hashes = write(tmp_path, "hashes", f"# acme, rotating\n{hash_key(old)}\n\n{hash_key(new)}\n")
    data = {
        **MINIMAL,
        "auth": {
            "keys": [
                {"sha256_file": hashes, "tenant": "acme", "requests_per_minute": 5},
                {"sha256": hash_key(ops), "tenant": "ops", "admin": True},
            ]
        },
    }
    auth = load_config(config_file(tmp_path, data), env={}).auth
    for key, tenant in ((old, "acme"), (new, "acme"), (ops, "ops")):
        caller = authenticate(auth, "/v1/models", {"Authorization": f"Bearer {key}"})
        assert caller.tenant == tenant and caller.key is not None and caller.key.sha256 == hash_key(key)
    assert {e.requests_per_minute for e in auth.entries if e.tenant == "acme"} == {5}
    with pytest.raises(AuthenticationError):
        authenticate(auth, "/v1/models", {"Authorization": "Bearer other"})


@pytest.mark.parametrize(
    "entry,key,words",
    [
        ({"sha256_file": "BAD_LINE"}, "auth.keys[0].sha256_file line 2", "64 lowercase hex"),
        ({"sha256_file": "COMMENTS"}, "auth.keys[0].sha256_file", "no digest"),
        ({"sha256_file": "/nonexistent/hashes"}, "auth.keys[0].sha256_file", "cannot read file"),
        ({"sha256_file": "BAD_LINE", "sha256": "0" * 64}, "auth.keys[0].sha256_file", "not both"),
        ({}, "auth.keys[0].sha256", "missing"),
        ({"sha256_file": "DUPLICATE"}, "auth.keys[0].sha256_file line 1", "twice"),
    ],
)
def test_a_bad_sha256_file_is_an_error_naming_the_key_and_line(
    tmp_path: Path, entry: dict[str, str], key: str, words: str
) -> None:
    files = {
        "BAD_LINE": write(tmp_path, "bad", f"{hash_key('a')}\nnot-a-digest\n"),
        "COMMENTS": write(tmp_path, "comments", "# nobody yet\n"),
        "DUPLICATE": write(tmp_path, "dup", f"{hash_key('b')}\n"),
    }
    keys = [{"tenant": "t", **{k: files.get(v, v) for k, v in entry.items()}}]
    if entry.get("sha256_file") == "DUPLICATE":
        keys.insert(0, {"sha256": hash_key("b"), "tenant": "u"})
        key = key.replace("keys[0]", "keys[1]")
    with pytest.raises(ConfigError) as err:
        load_config(config_file(tmp_path, {**MINIMAL, "auth": {"keys": keys}}), env={})
    assert err.value.key == key and words in str(err.value)


@pytest.fixture
async def replica() -> AsyncIterator[tuple[FakeReplica, str]]:
    fake = FakeReplica("r0")
    server = TestServer(fake.app)
    await server.start_server()
    yield fake, str(server.make_url("")).rstrip("/")
    await server.close()


@pytest.fixture
def logs(capfd: pytest.CaptureFixture[str]) -> Any:
    """Every log line the gateway writes (its real JSON set-up, at debug), read back by `logs().err`.
    Set up in the test's own phase: pytest swaps stderr between set-up, call and tear-down."""
    saved = structlog.get_config()
    yield capfd.readouterr
    structlog.configure(**saved)


@pytest.mark.parametrize("redis_from", ["env", "file"])
async def test_secrets_reach_redis_replica_and_key_check_but_no_log_line_or_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, replica: tuple[FakeReplica, str], logs: Any, redis_from: str
) -> None:
    fake, url = replica
    redis_password, backend_key, client_key, admin_key = (
        f"{name}-{secrets.token_hex(8)}" for name in ("redispw", "backendkey", "clientkey", "adminkey")
    )
    redis_url = f"redis://:{redis_password}@127.0.0.1:{free_port()}/0"  # nothing listens: the index degrades
    monkeypatch.setenv("AG_TEST_REDIS_URL", redis_url)
    shared = (
        {"url": "${AG_TEST_REDIS_URL}"}
        if redis_from == "env"
        else {"url_file": write(tmp_path, "redis-url", redis_url)}
    )
    data = {
        "pools": {
            MODEL: {
                "replicas": [{"url": url, "name": "r0"}],
                "routing": {"policy": "prefix_affinity"},
                "api_key_file": write(tmp_path, "backend-key", f"{backend_key}\n"),
            }
        },
        "redis": shared,
        "index": {"store": "redis", "mirror": False},
        "auth": {
            "keys": [
                {"sha256_file": write(tmp_path, "hashes", f"{hash_key(client_key)}\n"), "tenant": "acme"},
                {"sha256": hash_key(admin_key), "tenant": "ops", "admin": True},
            ]
        },
        "health": {"interval_s": 0.05},
        "load": {"interval_s": 0.05},
        "logging": {"requests": True},
    }
    path = config_file(tmp_path, data)
    setup_logging("debug", "json")
    config = load_config(path)
    assert config.redis is not None and config.redis.resolved_url == redis_url
    client = TestClient(TestServer(make_app(config, path)))
    await client.start_server()
    try:
        answers = await _every_route(client, client_key, admin_key)
        await until(lambda: fake.seen != [])
    finally:
        await client.close()
    assert fake.seen[0].headers["Authorization"] == f"Bearer {backend_key}"  # the key does reach the replica
    lines = logs().err
    assert main(["check", str(path)]) == 0
    answers.append(logs().out)  # `affinity-gateway check` prints the resolved config
    assert "pools:" in answers[-1] and "api_key_file:" in answers[-1]
    assert '"event":"request"' in lines and "index_redis_unreachable" in lines  # the capture sees the gateway
    for secret in (redis_password, backend_key, client_key, admin_key):
        assert secret not in lines, f"{secret.split('-')[0]} in a log line"
        assert all(secret not in answer for answer in answers), f"{secret.split('-')[0]} in an answer"


async def _every_route(client: TestClient[web.Request, web.Application], client_key: str, admin_key: str) -> list[str]:
    """The text of every route's answer, with the client key, the admin key and a wrong key."""
    user, admin = {"Authorization": f"Bearer {client_key}"}, {"Authorization": f"Bearer {admin_key}"}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi " * 50}]}
    requests = [
        ("GET", "/health", {}, None),
        ("GET", "/ready", {}, None),
        ("GET", "/metrics", {}, None),
        ("GET", "/v1/models", user, None),
        ("POST", "/v1/chat/completions", user, chat),
        ("POST", "/v1/chat/completions", {"Authorization": "Bearer wrong"}, chat),
        ("GET", "/admin/replicas", admin, None),
        ("POST", "/admin/route/explain", admin, chat),
        ("POST", "/admin/reload", admin, None),
        ("GET", "/metrics", {}, None),
    ]
    answers = []
    for method, route, headers, body in requests:
        response = await client.request(method, route, headers=headers, json=body)
        answers.append(f"{response.status} {dict(response.headers)} {await response.text()}")
    return answers
