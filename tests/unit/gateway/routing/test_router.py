"""Router: hash once, one index lookup, record on dispatch, explain, learn and measure on finish."""

from __future__ import annotations

import asyncio
import gc
import itertools
import weakref
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.config.features import IndexConfig, IndexStore
from gateway.config.pools import PrefixConfig
from gateway.index import MemoryIndex, build_index
from gateway.observability.routing_metrics import RoutingMetrics
from gateway.prompt import prefix_keys as prefix
from gateway.request.decision import Candidate, Outcome
from gateway.routing.policies.registry import build_policy
from gateway.routing.router import Router
from gateway.view import RequestView
from tests.helpers import free_port
from tests.unit.gateway.routing.policies.predictions import predict

IDS = ("a", "b", "c", "d")
SYSTEM = "You are a helpful assistant for the ACME support desk. Be brief. " * 10
_ids = itertools.count()


def chat_view(messages: list[dict[str, Any]], session: str | None = None) -> RequestView:
    return RequestView(f"req-{next(_ids)}", "chat", "m", True, {"messages": messages}, b"", session_key=session)


def conversation(turns: int, tag: str) -> list[dict[str, Any]]:
    msgs = [{"role": "system", "content": SYSTEM}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"[{tag}] question {i} " + "tell me more about it. " * 12})
        msgs.append({"role": "assistant", "content": f"[{tag}] answer {i} " + "here is more detail. " * 20})
    msgs.append({"role": "user", "content": f"[{tag}] next question"})
    return msgs


def candidates(loads: Sequence[int] = (0, 0, 0, 0)) -> list[Candidate]:
    return [Candidate(r, in_flight=n) for r, n in zip(IDS, loads)]


def make_router(policy: str = "prefix_affinity", index: Any = None, **params: Any) -> Router:
    return Router(
        build_policy(policy, params, "routing"),
        PrefixConfig(),
        index or MemoryIndex(10_000),
        RoutingMetrics(CollectorRegistry()),
    )


def sample(router: Router, name: str, **labels: str) -> float:
    assert router.metrics is not None
    for metric in [
        router.metrics.decisions,
        router.metrics.matched_tokens,
        router.metrics.cached_error,
        router.metrics.ttft_error,
        router.metrics.index_fallbacks,
    ]:
        for family in metric.collect():
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
    return 0.0


async def turn_done(router: Router, view: RequestView, candidates_: list[Candidate]) -> str:
    """Route a request and let it finish (the next turn only comes after the answer)."""
    decision = await router.route(view, candidates_)
    router.finished(view, decision.replica_id, Outcome(ok=True))
    return decision.replica_id


async def test_next_turn_goes_where_the_conversation_is_warm() -> None:
    router = make_router(seed=3)
    first = await router.route(view1 := chat_view(conversation(1, "x")), candidates())
    router.finished(view1, first.replica_id, Outcome(ok=True))
    second = await router.route(chat_view(conversation(2, "x")), candidates((1, 1, 1, 1)))
    assert second.replica_id == first.replica_id and second.reason == "prefix_hit"
    row = {s.replica_id: s for s in second.scores}
    assert row[first.replica_id].cached_tokens > 0
    assert all(
        row[r].cached_tokens == row[IDS[0] if first.replica_id != IDS[0] else IDS[1]].cached_tokens
        for r in IDS
        if r != first.replica_id
    )  # others hold only the shared system prompt, or nothing
    await router.close()


async def test_conversations_spread_while_their_turns_stick() -> None:
    router = make_router(seed=5)
    in_flight = dict.fromkeys(IDS, 0)
    homes: dict[str, str] = {}
    views: list[tuple[RequestView, str]] = []
    for turn in range(1, 4):
        for conv in range(8):
            view = chat_view(conversation(turn, f"c{conv}"))
            decision = await router.route(view, [Candidate(r, in_flight=in_flight[r]) for r in IDS])
            in_flight[decision.replica_id] += 1
            views.append((view, decision.replica_id))
            if turn > 1:
                assert decision.replica_id == homes[f"c{conv}"]
            homes[f"c{conv}"] = decision.replica_id
        for view, replica_id in views:  # the turn's requests finish
            router.finished(view, replica_id, Outcome(ok=True))
            in_flight[replica_id] -= 1
        views.clear()
    assert len(set(homes.values())) == 4


async def test_prompt_is_hashed_once_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = prefix.compute
    monkeypatch.setattr(prefix, "compute", lambda v, p: calls.append(v.request_id) or real(v, p))
    router = make_router()
    view = chat_view(conversation(1, "y"))
    await router.route(view, candidates())
    assert view.block_hashes and view.prompt_tokens_estimate > 0
    await router.route(view, candidates()[1:])  # a retry on the remaining replicas
    assert calls == [view.request_id]


async def test_dispatch_records_the_request_blocks() -> None:
    index = MemoryIndex(10_000)
    router = make_router(index=index)
    view = chat_view(conversation(1, "z"))
    decision = await router.route(view, candidates())
    matched = await index.match(view.block_hashes, IDS)
    assert matched[decision.replica_id] == len(view.block_hashes)
    assert sum(1 for r in IDS if matched[r]) == 1


async def test_explain_is_a_dry_run() -> None:
    index = MemoryIndex(10_000)
    router = make_router(index=index)
    warm = await router.route(view1 := chat_view(conversation(1, "e")), candidates())
    router.finished(view1, warm.replica_id, Outcome(ok=True))
    view = chat_view(conversation(2, "e"))
    report = await router.explain(view, candidates())
    assert report["replica"] == warm.replica_id and report["policy"] == "prefix_affinity"
    assert report["prefix_blocks"] == len(view.block_hashes) and report["index_degraded"] is False
    rows = {row["replica"]: row for row in report["candidates"]}
    assert set(rows) == set(IDS)
    assert rows[warm.replica_id]["cached_tokens"] > max(rows[r]["cached_tokens"] for r in IDS if r != warm.replica_id)
    assert all({"score", "wait_s", "load"} <= set(row) for row in rows.values())
    assert (await index.match(view.block_hashes, IDS))[warm.replica_id] < len(view.block_hashes)  # nothing recorded
    assert not router._predicted or view.request_id not in router._predicted


async def test_finished_measures_prediction_and_forgets_the_request() -> None:
    router = make_router(learn_alpha=1.0)
    await turn_done(router, chat_view(conversation(1, "f")), candidates())
    view = chat_view(conversation(2, "f"))
    decision = await router.route(view, candidates())
    predicted = {s.replica_id: s for s in decision.scores}[decision.replica_id]
    router.finished(
        view,
        decision.replica_id,
        Outcome(ok=True, ttft_s=0.3, prompt_tokens=view.prompt_tokens_estimate, cached_tokens=0),
    )
    assert view.request_id not in router._predicted
    assert 128 < predicted.cached_tokens <= 512  # the replica reported 0 cached: error = the prediction
    error = "affinity_gateway_route_cached_tokens_error_tokens_bucket"
    assert sample(router, error, le="128.0") == 0 and sample(router, error, le="512.0") == 1
    assert sample(router, "affinity_gateway_route_ttft_error_seconds_count") == 1
    await asyncio.sleep(0)  # a decision's metrics are recorded once the loop turns (gateway.support.soon)
    assert sample(router, "affinity_gateway_route_decisions_total", reason="prefix_hit") == 1
    assert sample(router, "affinity_gateway_route_matched_prefix_tokens_count") == 2
    policy = router.policy
    assert policy.cost.prefill_s_per_token(decision.replica_id) != 0.0002  # type: ignore[attr-defined]


async def test_finished_without_route_or_after_failure_is_harmless() -> None:
    router = make_router()
    view = chat_view(conversation(1, "g"))
    router.finished(view, "a", Outcome(ok=False))
    decision = await router.route(view, candidates())
    router.finished(view, decision.replica_id, Outcome(ok=False))
    assert not router._predicted


async def test_retried_request_learns_from_the_replica_that_answered() -> None:
    router = make_router(learn_alpha=1.0)
    view = chat_view(conversation(3, "retry"))
    first = await router.route(view, candidates())
    rest = [c for c in candidates() if c.replica_id != first.replica_id]
    second = await router.route(view, rest)
    # The server reports the failed attempt, then the one that answered.
    router.finished(view, first.replica_id, Outcome(ok=False))
    assert view.request_id in router._predicted
    router.finished(view, second.replica_id, Outcome(ok=True, ttft_s=2.0, prompt_tokens=1000, cached_tokens=0))
    assert not router._predicted and not router.policy._done_at  # type: ignore[attr-defined]
    assert sample(router, "affinity_gateway_route_ttft_error_seconds_count") == 1
    assert router.policy.cost.prefill_s_per_token(second.replica_id) != 0.0002  # type: ignore[attr-defined]


async def test_policies_without_prefix_skip_hashing() -> None:
    router = make_router("least_loaded")
    view = chat_view(conversation(1, "h"))
    decision = await router.route(view, candidates((2, 0, 1, 1)))
    assert decision.replica_id == "b" and view.block_hashes == ()


async def test_consistent_hash_hashes_but_needs_no_index() -> None:
    index = MemoryIndex(10_000)
    router = make_router("consistent_hash", index=index)
    view = chat_view(conversation(1, "i"))
    await router.route(view, candidates())
    assert view.block_hashes and index.size("a") + index.size("b") + index.size("c") + index.size("d") == 0


@pytest.mark.redis
async def test_two_gateways_sharing_redis_keep_a_conversation_together(redis_url: str) -> None:
    store = IndexStore(IndexConfig(), redis_url, f"router-test-{next(_ids)}:")
    one, two = make_router(index=build_index(store), seed=1), make_router(index=build_index(store), seed=2)
    try:
        replicas = set()
        for turn in range(1, 5):
            router = one if turn % 2 else two
            replicas.add(await turn_done(router, chat_view(conversation(turn, "shared")), candidates()))
            await router.index.flush()  # in Redis and published,
            await (two if router is one else one).index.flush()  # and applied by the other's mirror
        assert len(replicas) == 1
    finally:
        await one.close()
        await two.close()


async def test_routing_continues_when_redis_is_unreachable() -> None:
    params = IndexConfig(timeout_s=0.05, reconnect_max_s=0.05)
    router = make_router(index=build_index(IndexStore(params, f"redis://127.0.0.1:{free_port()}/0")))
    try:
        first = await turn_done(router, chat_view(conversation(1, "down")), candidates())
        second = await router.route(chat_view(conversation(2, "down")), candidates())
        assert second.replica_id == first  # the local table still knows the conversation
        assert router.index.degraded
        assert sample(router, "affinity_gateway_index_fallback_total") >= 1
        assert (await router.explain(chat_view(conversation(2, "down")), candidates()))["index_degraded"] is True
    finally:
        await router.close()


async def test_the_answer_is_recorded_so_a_short_next_turn_matches_it() -> None:
    """Turn 1 is short (all preamble); its answer is what the replica holds beyond the preamble."""
    router = make_router()
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
    view = chat_view(first)
    decision = await router.route(view, candidates())
    answer = "Hello! How can I help you today with your ACME order? " * 3
    router.finished(view, decision.replica_id, Outcome(ok=True, answer=answer))
    nxt = chat_view([*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "ok"}])
    matched = await router.index.match(prefix.compute(nxt, router.prefix_params).block_hashes, IDS)
    assert matched[decision.replica_id] > len(view.block_hashes)  # the answer's blocks are warm too
    assert all(matched[r] == 0 for r in IDS if r != decision.replica_id)
    # A failed answer records nothing beyond the dispatched prompt.
    other = make_router()
    view2 = chat_view(first)
    decision2 = await other.route(view2, candidates())
    other.finished(view2, decision2.replica_id, Outcome(ok=False, answer=answer))
    matched2 = await other.index.match(prefix.compute(nxt, other.prefix_params).block_hashes, IDS)
    assert matched2[decision2.replica_id] == len(view2.block_hashes)


async def test_character_keys_learn_the_replicas_tokens_per_estimated_token() -> None:
    """Replicas count half the tokens chars/4 estimates: the estimate follows, and each replica's table
    is resized to the KV capacity in the replica's own tokens (twice the blocks)."""
    router = make_router()
    router.calibration.set_capacity("a", 16_000)
    before = router.index.capacity("a")  # type: ignore[attr-defined]
    for i in range(40):
        view = chat_view(conversation(1, f"ratio-{i}"))
        decision = await router.route(view, candidates())
        raw = view.prompt_tokens_estimate / router.calibration.token_ratio_of(view)  # chars/4, before the learned scale
        router.finished(view, decision.replica_id, Outcome(ok=True, prompt_tokens=round(raw / 2)))
    assert router.calibration.token_ratio == pytest.approx(0.5, rel=0.05)
    assert router.index.capacity("a") == pytest.approx(2 * before, rel=0.05)  # type: ignore[attr-defined]
    view = chat_view(conversation(1, "after"))
    await router.route(view, candidates())
    raw = prefix.compute(chat_view(conversation(1, "after")), PrefixConfig()).prompt_tokens
    assert view.prompt_tokens_estimate == pytest.approx(raw / 2, rel=0.05)


@pytest.mark.parametrize("block_chars", [64, 512])  # 16- and 128-token blocks
async def test_a_conversations_own_system_prompt_is_never_spread(block_chars: int) -> None:
    """One conversation with a long system prompt of its own and short turns: with 128-token blocks
    its history past the preamble stays inside the block that straddles the preamble's end for
    several turns, and the preamble, seen on every turn, looked like a popular one that wants more
    replicas: the conversation was moved off its home (re-prefilling everything) while its home
    was a request busier than the rest."""
    router = Router(
        build_policy("prefix_affinity", {"seed": 1}, "routing"),
        PrefixConfig(block_chars=block_chars),
        MemoryIndex(10_000),
    )
    system = "You are the archivist of one family's letters; " + "answer from the letters only. " * 60
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    homes = []
    for turn in range(8):
        messages.append({"role": "user", "content": f"Letter {turn}?"})
        view = chat_view(list(messages))
        busy = [1 if homes and r == homes[0] else 0 for r in IDS]
        decision = await router.route(view, candidates(busy))
        answer = f"Letter {turn} is from May."
        router.finished(view, decision.replica_id, Outcome(ok=True, answer=answer))
        messages.append({"role": "assistant", "content": answer})
        homes.append(decision.replica_id)
    assert homes == [homes[0]] * 8
    await router.close()


async def test_a_prompt_stays_warm_where_a_request_of_it_runs_though_history_trimmed_it() -> None:
    """A replica cannot evict the blocks of a request it serves. The history table trims by send
    order, so under a deep queue it forgot a long prompt still running at its home, and the next
    request of that prompt was prefilled a second time elsewhere. Once that request ends, its blocks
    are the replica's to evict again."""
    router = make_router(index=MemoryIndex(24), seed=1)
    prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "the long document " * 60}]
    running = chat_view(prompt)
    home = (await router.route(running, candidates())).replica_id
    only_home = [Candidate(home)]
    for i in range(4):  # other prompts sent there since: the table's LRU trims the running one
        await turn_done(
            router, chat_view([{"role": "user", "content": f"filler {i} " + "other words " * 60}]), only_home
        )
    assert router.index.match_now(running.block_hashes, [home])[home] == 0
    again = chat_view(prompt)
    decision = await router.decide(again, [Candidate(r, in_flight=int(r == home)) for r in IDS])
    rows = {s.replica_id: s for s in decision.scores}
    assert rows[home].cached_tokens == len(again.block_hashes) * again.tokens_per_block  # every whole block
    assert decision.replica_id == home
    router.finished(running, home, Outcome(ok=True))
    later = chat_view(prompt)
    rows = {s.replica_id: s for s in (await router.decide(later, candidates())).scores}
    assert rows[home].cached_tokens == 0
    await router.close()


async def test_a_removed_replica_leaves_no_warm_prefix_nor_queued_prefill_behind() -> None:
    index = MemoryIndex(10_000)
    router = make_router(index=index)
    view = chat_view(conversation(2, "gone"))
    chosen = (await router.route(view, candidates())).replica_id
    cost = router.policy.cost  # type: ignore[attr-defined]
    assert index.size(chosen) > 0 and predict(cost, Candidate(chosen), 0, cost.clock())[0] > 0  # queued there
    await router.removed(chosen)
    assert index.size(chosen) == 0 and predict(cost, Candidate(chosen), 0, cost.clock())[0] == 0


async def test_a_router_is_freed_as_soon_as_it_is_dropped_not_at_a_full_collection() -> None:
    """A reload drops the routers it replaces: their tables must go with them, not wait for the cyclic
    collector, which the gateway runs rarely (gateway.support.heap). A router decides, its metrics are
    queued, and once dropped no reference cycle keeps it."""
    router = make_router()
    view = chat_view(conversation(1, "gone"))
    router.dispatched(view, await router.decide(view, candidates()))
    await asyncio.sleep(0)  # the queued metrics are recorded
    gone = weakref.ref(router)
    gc.disable()
    try:
        del router
        assert gone() is None
    finally:
        gc.enable()
