"""LoRA adapters (gateway.routing.adapters): config, which replicas serve one, the candidates the policy sees,
and prefix keys salted by adapter, in requests and in KV events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gateway.config.loader import load_config, parse_config
from gateway.config.sections import AdmissionConfig
from gateway.errors import ConfigError, NotFoundError
from gateway.index.exact import EVENTS, ExactTables
from gateway.observability.routing_metrics import RoutingMetrics
from gateway.prompt import prefix_keys as prefix
from gateway.routing.adapters import named
from gateway.routing.route_table import RouteTable
from gateway.serving.admission import Admission
from gateway.view import RequestView

pytestmark = pytest.mark.timeout(10)
BS = 16


def pools(**extra: Any) -> dict[str, Any]:
    return {
        "pools": {
            "base": {
                "replicas": [
                    {"url": "http://a:1", "name": "a", "adapters": ["only-a"]},
                    {"url": "http://b:1", "name": "b"},
                    {"url": "http://c:1", "name": "c"},
                ],
                "adapters": ["everywhere"],
                "aliases": ["alias"],
                "routing": {"policy": "prefix_affinity"},
            },
            "other": {"replicas": [{"url": "http://d:1", "name": "d"}]},
        },
        **extra,
    }


async def started(tmp_path: Path, data: dict[str, Any]) -> RouteTable:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(data))
    state = RouteTable(load_config(path), path, RoutingMetrics(CollectorRegistry()))
    await state.start()
    return state


def view(model: str, text: str = "x" * 640) -> RequestView:
    return RequestView("r", "completions", model, False, {"model": model, "prompt": text}, b"raw")


@pytest.mark.parametrize(
    ("adapters", "key", "words"),
    [
        ({"base": ["other"]}, "pools.base.adapters[0]", "a pool or an exact alias"),
        ({"base": ["alias"]}, "pools.base.adapters[0]", "a pool or an exact alias"),
        ({"base": ["x"], "other": ["x"]}, "pools.other.adapters[0]", "an adapter of pool 'base'"),
        ({"base": [" "]}, "pools.base.adapters[0]", "non-empty"),
    ],
)
def test_declared_adapters_are_names_of_their_own(adapters: dict[str, list[str]], key: str, words: str) -> None:
    data = pools()
    for pool, names in adapters.items():
        data["pools"][pool]["adapters"] = names
    with pytest.raises(ConfigError, match=words) as info:
        parse_config(data)
    assert info.value.key == key


def test_a_replicas_adapter_may_repeat_its_pools() -> None:
    data = pools()
    data["pools"]["base"]["replicas"][1]["adapters"] = ["everywhere"]
    assert parse_config(data).pools["base"].adapters == ("everywhere",)


async def test_declared_and_discovered_adapters_resolve_to_their_pool(tmp_path: Path) -> None:
    state = await started(tmp_path, pools())
    b = state.routes["base"].pool.get("b")
    d = state.routes["other"].pool.get("d")
    assert b is not None and d is not None
    b.adapters = {"found": "/loras/found", "alias": None, "other": None}  # a pool's or alias's name stays theirs
    d.adapters = {"found": None, "d-only": "/loras/d"}  # the first pool in config order has "found"
    state.after_scrape()
    m = state.adapters
    assert m.pool_of == {"only-a": "base", "found": "base", "everywhere": "base", "d-only": "other"}
    assert m.servers == {
        "only-a": frozenset({"a"}),
        "found": frozenset({"b"}),
        "everywhere": None,
        "d-only": frozenset({"d"}),
    }
    assert m.roots == {
        "base": {"only-a": None, "found": "/loras/found", "everywhere": None},
        "other": {"d-only": "/loras/d"},
    }
    assert state.route_for("found").model == "base" and state.route_for("alias").model == "base"
    with pytest.raises(NotFoundError):
        state.route_for("gone")
    await state.close()


async def test_an_adapter_keeps_its_name_an_alias_is_renamed(tmp_path: Path) -> None:
    state = await started(tmp_path, pools())
    request = view("only-a")
    named(request, "base", state.adapters)
    assert (request.model, request.adapter, request.raw, request.body["model"]) == ("base", "only-a", b"raw", "only-a")
    aliased = view("alias")
    named(aliased, "base", state.adapters)
    assert (aliased.model, aliased.adapter, aliased.body["model"]) == ("base", None, "base")
    await state.close()


async def test_only_replicas_serving_the_adapter_are_candidates(tmp_path: Path) -> None:
    state = await started(tmp_path, pools())
    route, admission = state.routes["base"], Admission(lambda model, waited_s: None)
    for model, allowed in (("only-a", {"a"}), ("everywhere", {"a", "b", "c"}), ("base", {"a", "b", "c"})):
        request = view(model)
        if model != "base":
            named(request, "base", state.adapters)
        exclude = state.adapters.excluded(request, route, set())
        assert {c.replica_id for c in route.pool.candidates(exclude)} == allowed
        chosen = await admission.choose(route, request, exclude, AdmissionConfig())
        assert chosen is not None and chosen[0].replica_id in allowed
    request = view("only-a")
    named(request, "base", state.adapters)
    a = route.pool.get("a")
    assert a is not None
    a.healthy = False  # the one replica serving it is down: no candidate (503), not a 404
    assert (
        await admission.choose(route, request, state.adapters.excluded(request, route, set()), AdmissionConfig())
        is None
    )
    await state.close()


def test_the_same_prompt_for_two_adapters_gets_two_chains() -> None:
    params = prefix.PrefixConfig()
    chains = []
    for adapter in (None, "sql", "chat"):
        request = view("base")
        request.adapter = adapter
        chains.append(prefix.compute(request, params).block_hashes)
    assert len(chains[0]) == 10 and len({c[0] for c in chains}) == 3 and len({c[-1] for c in chains}) == 3
    request = view("base")
    request.adapter = "sql"
    assert prefix.compute(request, params).block_hashes == chains[1]


def test_kv_events_keep_each_adapters_blocks_apart() -> None:
    ids = list(range(1, 4 * BS + 1))
    root = prefix.model_seed("base")
    keys = {
        adapter: prefix.chain_hash_tokens(ids, BS, root if adapter is None else prefix.adapter_seed(root, adapter), 100)
        for adapter in (None, "sql", "chat")
    }
    tables = ExactTables(root, BS)
    tables.stored("a", [1, 2, 3, 4], None, ids, BS, lora_id=1, lora_name="sql")
    assert tables.match(keys["sql"], "a") == (4, EVENTS)
    assert tables.match(keys[None], "a") == (0, EVENTS) and tables.match(keys["chat"], "a") == (0, EVENTS)
    tables.stored("a", [5, 6, 7, 8], None, ids, BS, lora_id=2)  # an id alone (vLLM <= 0.11): kept apart
    tables.stored("a", [9], 4, list(range(100, 100 + BS)), BS)  # continues sql's chain through its parent
    assert tables.match(keys[None], "a")[0] == tables.match(keys["chat"], "a")[0] == 0
    assert tables.match(
        keys["sql"] + prefix.chain_hash_tokens(list(range(100, 100 + BS)), BS, keys["sql"][-1], 1), "a"
    ) == (5, EVENTS)


def test_decoded_events_carry_the_adapter_in_either_encoding() -> None:
    import msgpack

    from gateway.index.kv_events.decode import Stored, decode_batch

    array = ["BlockStored", [1], None, list(range(BS)), BS, 3, "GPU"]
    newer = {
        "type": "BlockStored",
        "block_hashes": [1],
        "parent_block_hash": None,
        "token_ids": list(range(BS)),
        "block_size": BS,
        "lora_id": 3,
        "medium": "GPU",
        "lora_name": "sql",
    }
    base = {**newer, "lora_id": None, "lora_name": None}
    events = decode_batch(msgpack.packb([0.0, [array, newer, base], None]))
    assert [(e.lora_id, e.lora_name) for e in events if isinstance(e, Stored)] == [(3, None), (3, "sql"), (None, None)]


async def test_a_replicas_card_and_adapters_come_from_its_model_list_and_survive_a_bad_answer() -> None:
    import aiohttp
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from gateway.replicas import Replica
    from gateway.replicas.models import list_models

    answers = [
        {
            "data": [
                {"id": "base", "parent": None, "root": "/m", "max_model_len": 4096, "owned_by": "vllm"},
                {"id": "sql", "parent": "base", "root": "/loras/sql"},
                {"id": "chat", "parent": "base"},
                "junk",
            ]
        },
        {"error": "down"},
    ]
    seen: list[str | None] = []

    async def models(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response(answers.pop(0), status=200 if answers else 503)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
        replica = Replica("a", str(server.make_url("")).rstrip("/"))
        await list_models(session, replica, "base", {"Authorization": "Bearer k"}, 1.0)
        assert replica.adapters == {"sql": "/loras/sql", "chat": None} and seen == ["Bearer k"]
        assert replica.model_card == {"max_model_len": 4096, "root": "/m"}
        await list_models(session, replica, "base", {}, 1.0)  # a 503: the last list stands
        assert replica.adapters == {"sql": "/loras/sql", "chat": None} and replica.model_card["max_model_len"] == 4096


async def test_adapter_requests_use_the_history_where_events_name_adapters_by_id_only() -> None:
    from gateway.config.pools import PrefixConfig
    from gateway.index import MemoryIndex
    from gateway.prompt.prompt_keys import PromptKeys
    from gateway.prompt.tokenizers import SimPromptTokenizer
    from gateway.request.decision import Candidate
    from gateway.routing.policies.registry import build_policy
    from gateway.routing.router import HISTORY, Router

    params = PrefixConfig(tokenizer="sim", block_tokens=BS)
    exact = ExactTables(prefix.model_seed("base"), BS)
    router = Router(
        build_policy("prefix_affinity", {}, "p"),
        params,
        MemoryIndex(10_000),
        RoutingMetrics(CollectorRegistry()),
        pool="base",
        keys=PromptKeys(SimPromptTokenizer(), 5.0),
        exact=exact,
    )

    def adapter_view() -> RequestView:
        request = view("base", " ".join(f"w{i}" for i in range(100)))
        request.adapter = "sql"
        return request

    exact.set_certain("a", True)
    assert (await router.explain(adapter_view(), [Candidate("a")]))["evidence"] == {"a": EVENTS}
    exact.stored("a", [1], None, list(range(BS)), BS, lora_id=1)
    assert not exact.names_adapters
    assert (await router.explain(adapter_view(), [Candidate("a")]))["evidence"] == {"a": HISTORY}
    await router.close()
