"""Exact tables from KV events, speculative entries, and the router's evidence ladder."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gateway.config.loader import load_config
from gateway.config.pools import PrefixConfig
from gateway.errors import ConfigError
from gateway.index import MemoryIndex
from gateway.index.exact import EVENTS, SPECULATIVE, ExactTables
from gateway.observability.routing_metrics import RoutingMetrics
from gateway.prompt import prefix_keys as prefix
from gateway.prompt.prompt_keys import PromptKeys
from gateway.prompt.tokenizers import SimPromptTokenizer
from gateway.request.decision import Candidate, Outcome
from gateway.routing.policies.registry import build_policy
from gateway.routing.router import CHARACTERS, HISTORY, Router
from gateway.view import RequestView

pytestmark = pytest.mark.timeout(30)
MODEL, BS = "m", 16
_ids = itertools.count()
_engine_hashes = itertools.count(1000)


def tokens(n: int, start: int = 1) -> list[int]:
    return list(range(start, start + n))


def own_chain(ids: list[int]) -> tuple[int, ...]:
    return prefix.chain_hash_tokens(ids, BS, prefix.model_seed(MODEL), 10_000)


def store(tables: ExactTables, replica: str, ids: list[int], parent: int | None = None) -> list[int]:
    """Publish `ids` as full blocks the way an engine does: its own (arbitrary) hashes, chained by parent."""
    engine = [next(_engine_hashes) for _ in range(len(ids) // BS)]
    tables.stored(replica, engine, parent, ids, BS)
    return engine


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_stored_blocks_get_the_requests_own_chain_keys_across_events() -> None:
    tables = ExactTables(prefix.model_seed(MODEL), BS)
    ids = tokens(5 * BS)
    first = store(tables, "a", ids[: 2 * BS])
    store(tables, "a", ids[2 * BS :], parent=first[-1])  # a later step continues the chain
    assert tables.size("a") == 5
    assert tables.match(own_chain(ids + tokens(BS, 999)), "a") == (5, EVENTS)
    assert tables.match(own_chain(tokens(5 * BS, 7)), "a") == (0, EVENTS)  # other tokens, other keys


def test_removed_block_ends_the_match_there_and_cleared_empties() -> None:
    tables = ExactTables(prefix.model_seed(MODEL), BS)
    ids = tokens(4 * BS)
    engine = store(tables, "a", ids)
    store(tables, "a", ids[: 2 * BS])  # a duplicate store under other engine hashes (e.g. another LoRA)
    tables.removed("a", [engine[1], 123456789])  # unknown hashes are ignored
    assert tables.match(own_chain(ids), "a") == (4, EVENTS)  # block 1 is still held by the duplicate
    tables.removed("a", [engine[2]])
    assert tables.match(own_chain(ids), "a") == (2, EVENTS)
    tables.cleared("a")
    assert tables.match(own_chain(ids), "a") == (0, EVENTS) and tables.size("a") == 0


def test_a_block_whose_parent_was_never_seen_is_an_orphan_not_a_wrong_key() -> None:
    tables = ExactTables(prefix.model_seed(MODEL), BS)
    store(tables, "a", tokens(2 * BS), parent=424242)
    assert tables.size("a") == 0 and tables.describe("a")["orphan_blocks"] == 2


def test_speculative_entries_count_until_they_expire() -> None:
    clock = Clock()
    tables = ExactTables(prefix.model_seed(MODEL), BS, speculative_ttl_s=2.0, clock=clock)
    ids = tokens(4 * BS)
    tables.speculate("a", own_chain(ids))  # no table for "a" yet: no feed, nothing to speculate on
    assert not tables.covers("a")
    tables.set_certain("a", True)
    store(tables, "a", ids[:BS])
    tables.speculate("a", own_chain(ids))
    assert tables.match(own_chain(ids), "a") == (4, SPECULATIVE)
    clock.now += 2.5
    assert tables.match(own_chain(ids), "a") == (1, EVENTS)


# -- the router's ladder: events where a certain feed exists, history (token keys) elsewhere --


def chat(*contents: str, **extra: Any) -> RequestView:
    messages = [{"role": "system", "content": "You are terse. " * 30}]
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(contents)]
    body = {"model": MODEL, "messages": messages, **extra}
    return RequestView(f"r{next(_ids)}", "chat", MODEL, True, body, b"")


def sim_tokens(view: RequestView) -> list[int]:
    encoded = SimPromptTokenizer().encode("chat", view.body)
    assert encoded is not None
    return list(encoded.token_ids)


def token_router(exact: ExactTables) -> Router:
    policy = build_policy("prefix_affinity", {"seed": 1}, "routing")
    return Router(
        policy,
        PrefixConfig(tokenizer="sim", block_tokens=BS),
        MemoryIndex(10_000),
        RoutingMetrics(CollectorRegistry()),
        pool=MODEL,
        keys=PromptKeys(SimPromptTokenizer(), 5.0),
        exact=exact,
    )


async def test_router_uses_events_for_covered_replicas_and_history_for_the_rest() -> None:
    exact = ExactTables(prefix.model_seed(MODEL), BS)
    router = token_router(exact)
    view = chat("What is the capital of France? " * 20)
    ids = sim_tokens(view)
    exact.set_certain("a", True)
    store(exact, "a", ids[: (len(ids) // BS) * BS])
    router.index.record("b", own_chain(ids)[:3])  # history says "b" has three blocks
    explained = await router.explain(view, [Candidate("a"), Candidate("b"), Candidate("c")])
    assert explained["prefix_keys"] == "tokens"
    assert explained["evidence"] == {"a": EVENTS, "b": HISTORY, "c": HISTORY}
    cached = {row["replica"]: row["cached_tokens"] for row in explained["candidates"]}
    assert cached == {"a": (len(ids) // BS) * BS, "b": 3 * BS, "c": 0}
    decision = await router.route(view, [Candidate("a"), Candidate("b"), Candidate("c")])
    assert decision.replica_id == "a"
    router.finished(view, "a", Outcome(ok=True, ttft_s=0.01, cached_tokens=(len(ids) // BS) * BS))
    await asyncio.sleep(0)  # a decision's metrics are recorded once the loop turns (gateway.support.soon)
    assert _sample(router, "affinity_gateway_route_evidence_total", evidence=EVENTS) == 1
    assert _sample(router, "affinity_gateway_route_cached_tokens_error_tokens_count", evidence=EVENTS) == 1
    assert _sample(router, "affinity_gateway_route_cached_tokens_error_tokens_sum", evidence=EVENTS) == 0
    await router.close()


async def test_uncertain_table_takes_the_larger_of_events_and_history() -> None:
    exact = ExactTables(prefix.model_seed(MODEL), BS)
    router = token_router(exact)
    view = chat("Tell me about block caches. " * 20)
    ids = sim_tokens(view)
    store(exact, "a", ids[:BS])  # a table, but not certain (events since a gap only)
    router.index.record("a", own_chain(ids)[:4])
    explained = await router.explain(view, [Candidate("a")])
    assert explained["evidence"] == {"a": HISTORY}
    assert explained["candidates"][0]["cached_tokens"] == 4 * BS
    await router.close()


async def test_salted_requests_and_tokenizer_less_pools_never_read_the_event_tables() -> None:
    exact = ExactTables(prefix.model_seed(MODEL), BS)
    router = token_router(exact)
    view = chat("Same text. " * 40, cache_salt="tenant-7")
    ids = sim_tokens(view)
    exact.set_certain("a", True)
    store(exact, "a", ids[: (len(ids) // BS) * BS])
    explained = await router.explain(view, [Candidate("a")])
    assert explained["evidence"] == {"a": HISTORY} and explained["candidates"][0]["cached_tokens"] == 0
    await router.close()
    plain = Router(build_policy("prefix_affinity", {}, "routing"), PrefixConfig(), exact=exact)
    explained = await plain.explain(chat("Same text. " * 40), [Candidate("a")])
    assert explained["prefix_keys"] == "characters" and explained["evidence"] == {"a": CHARACTERS}
    await plain.close()


class SlowTokenizer(SimPromptTokenizer):
    def encode(self, endpoint: str, body: Any) -> Any:
        time.sleep(0.3)
        return super().encode(endpoint, body)


async def test_over_budget_tokenizer_falls_back_to_characters_and_counts() -> None:
    router = token_router(ExactTables(prefix.model_seed(MODEL), BS))
    await router.keys.close()  # type: ignore[union-attr]
    router.keys = PromptKeys(SlowTokenizer(), budget_s=0.02)
    explained = await router.explain(chat("Hello there. " * 50), [Candidate("a")])
    assert explained["prefix_keys"] == "characters"
    assert _sample(router, "affinity_gateway_tokenize_fallback_total") == 1
    await router.close()


def _sample(router: Router, name: str, **labels: str) -> float:
    assert router.metrics is not None
    m = router.metrics
    for metric in (m.evidence, m.cached_error, m.tokenize_fallbacks):
        for family in metric.collect():
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
    return 0.0


def test_a_stored_event_replaces_the_speculation_so_a_later_eviction_counts_at_once() -> None:
    tables = ExactTables(prefix.model_seed(MODEL), BS, speculative_ttl_s=60.0)
    ids = tokens(3 * BS)
    tables.set_certain("a", True)
    tables.speculate("a", own_chain(ids))
    engine = store(tables, "a", ids)
    tables.removed("a", engine)
    assert tables.match(own_chain(ids), "a") == (0, EVENTS)


@pytest.mark.parametrize(
    ("change", "key", "text"),
    [
        ({"tokenizer": "/no/such/folder"}, "routing.prefix.tokenizer", "no such file"),
        ({"kv_events_without_tokenizer": True}, "replicas[0].kv_events", "set routing.prefix.tokenizer"),
    ],
)
def test_config_names_the_key_of_a_bad_tokenizer_or_a_feed_without_one(
    tmp_path: Path, change: dict[str, Any], key: str, text: str
) -> None:
    replica: dict[str, Any] = {"url": "http://127.0.0.1:9", "kv_events": {"endpoint": "tcp://127.0.0.1:5557"}}
    prefix_section = {} if "kv_events_without_tokenizer" in change else {"tokenizer": change["tokenizer"]}
    pool = {"replicas": [replica], "routing": {"policy": "prefix_affinity", "prefix": prefix_section}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"pools": {MODEL: pool}}))
    with pytest.raises(ConfigError) as failed:
        load_config(path)
    assert f"pools.{MODEL}.{key}" in str(failed.value) and text in str(failed.value)


async def test_stored_blocks_are_shared_with_the_history_index_when_asked() -> None:
    history = MemoryIndex(10_000)
    tables = ExactTables(prefix.model_seed(MODEL), BS, share=history.record)
    ids = tokens(3 * BS)
    first = store(tables, "a", ids[: 2 * BS])
    store(tables, "a", ids[2 * BS :], parent=first[-1])
    assert await history.match(own_chain(ids), ["a", "b"]) == {"a": 3, "b": 0}
