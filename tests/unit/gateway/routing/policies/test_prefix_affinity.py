"""prefix_affinity, session_affinity and consistent_hash: the hot-spot and herding cases."""

from __future__ import annotations

import collections
import math
import random
from collections.abc import Sequence
from typing import Any

import pytest

from gateway.errors import ConfigError
from gateway.request.decision import Candidate, Decision, Outcome, Score
from gateway.routing.policies import Policy
from gateway.routing.policies.bound import has_room, has_room_loads
from gateway.routing.policies.prefix_affinity import PrefixAffinityPolicy
from gateway.routing.policies.registry import build_policy
from gateway.view import RequestView
from tests.unit.gateway.routing.policies.predictions import predict, wait_s

IDS = ("a", "b", "c", "d")
_ids = iter(range(10**9))


def make_view(prompt_tokens: int = 2100, session: str | None = None, hashes: tuple[int, ...] = ()) -> RequestView:
    return RequestView(
        f"req-{next(_ids)}",
        "chat",
        "m",
        False,
        {},
        b"",
        session_key=session,
        prompt_tokens_estimate=prompt_tokens,
        block_hashes=hashes,
    )


def make_candidates(**kw: Sequence[Any]) -> list[Candidate]:
    """make_candidates(cached_tokens=[...], in_flight=[...]) for replicas a, b, c, d."""
    n = len(next(iter(kw.values()))) if kw else len(IDS)
    return [Candidate(IDS[i], **{k: v[i] for k, v in kw.items()}) for i in range(n)]


def prefix_policy(**params: Any) -> PrefixAffinityPolicy:
    """The policy with the bound's floor at 2 requests, so small test fleets exercise it."""
    policy = build_policy("prefix_affinity", {"seed": 7, "min_bound_requests": 2, **params}, "routing")
    assert isinstance(policy, PrefixAffinityPolicy)
    return policy


def dispatch(policy: Policy, view: RequestView, candidates: list[Candidate]) -> str:
    decision = policy.choose(view, candidates)
    policy.on_dispatched(view, decision)
    return decision.replica_id


# --- prefix_affinity ----------------------------------------------------------------------------


def test_distinct_warm_prefix_wins_at_equal_load() -> None:
    decision = prefix_policy().choose(make_view(), make_candidates(cached_tokens=[0, 1500, 0, 300]))
    assert decision.replica_id == "b" and decision.reason == "prefix_hit"
    row = {s.replica_id: s for s in decision.scores}["b"]
    assert row.cached_tokens == 1500 and row.score == pytest.approx(600 * 0.0002)


def test_overlap_every_candidate_holds_gives_no_preference() -> None:
    policy = prefix_policy()
    counts = collections.Counter(
        policy.choose(make_view(), make_candidates(cached_tokens=[2000] * 4)).replica_id for _ in range(400)
    )
    assert set(counts) == set(IDS) and min(counts.values()) > 60
    # ...so the least loaded replica takes it, exactly as with no shared prefix at all.
    decision = policy.choose(make_view(), make_candidates(cached_tokens=[2000] * 4, in_flight=[3, 3, 2, 3]))
    assert decision.replica_id == "c" and decision.reason == "least_wait"


def test_one_overloaded_replica_does_not_switch_off_affinity_for_others() -> None:
    decision = prefix_policy().choose(
        make_view(), make_candidates(cached_tokens=[0, 1800, 0, 0], in_flight=[2, 2, 2, 40])
    )
    assert decision.replica_id == "b" and decision.reason == "prefix_hit"


def test_hot_shared_prefix_spreads_beyond_its_first_holder() -> None:
    """A hot 2000-token prefix starts on `a`; requests keep coming (none finish). Over the load bound a
    holder keeps a request only while its cache is worth more than its queue: the prefix still spreads."""
    policy = prefix_policy()
    in_flight = dict.fromkeys(IDS, 0)
    warm = {"a"}
    for _ in range(24):
        candidates = [Candidate(r, in_flight=in_flight[r], cached_tokens=2000 if r in warm else 0) for r in IDS]
        chosen = dispatch(policy, make_view(), candidates)
        in_flight[chosen] += 1
        warm.add(chosen)
    assert warm == set(IDS)
    assert max(in_flight.values()) <= math.ceil(1.5 * 24 / 4)


def test_queue_growth_outweighs_cache_benefit() -> None:
    """The wait term dominates once the holder's queue is longer than the prefill it saves."""
    policy = prefix_policy(load_epsilon=100.0)  # bound out of the way: only the cost decides
    chosen = [dispatch(policy, make_view(), make_candidates(cached_tokens=[2000, 0, 0, 0])) for _ in range(3)]
    assert chosen[0] == "a"
    candidates = make_candidates(cached_tokens=[2000, 0, 0, 0], in_flight=[60, 0, 0, 0])
    assert policy.choose(make_view(), candidates).replica_id != "a"


@pytest.mark.parametrize("update_load", [True, False], ids=["in_flight_updated", "stale_load"])
def test_burst_of_identical_cold_requests_does_not_herd(update_load: bool) -> None:
    policy = prefix_policy()
    in_flight = dict.fromkeys(IDS, 0)
    for _ in range(8):
        candidates = [Candidate(r, in_flight=in_flight[r] if update_load else 0) for r in IDS]
        in_flight[dispatch(policy, make_view(), candidates)] += 1
    assert sorted(in_flight.values()) == [2, 2, 2, 2]


def test_burst_of_identical_warm_requests_spreads_by_the_bound() -> None:
    policy = prefix_policy()
    in_flight = dict.fromkeys(IDS, 0)
    for _ in range(12):
        candidates = [Candidate(r, in_flight=in_flight[r], cached_tokens=2000 if r == "a" else 0) for r in IDS]
        in_flight[dispatch(policy, make_view(), candidates)] += 1
    # The holder keeps more than its share (its cache is worth a queue), but the burst still spreads.
    assert 3 <= in_flight["a"] <= 10 and sum(1 for v in in_flight.values() if v) >= 2


def test_load_bound_holds_for_random_fleets() -> None:
    """Over the bound only where staying beats moving by more than the replica's whole predicted wait."""
    rng = random.Random(1)
    policy = prefix_policy()
    kept = 0
    for _ in range(500):
        n = rng.randint(1, 6)
        candidates = [
            Candidate(
                f"r{i}",
                in_flight=rng.randint(0, 12),
                weight=rng.choice([1.0, 2.0]),
                cached_tokens=rng.choice([0, 500, 2000]),
            )
            for i in range(n)
        ]
        decision = policy.choose(make_view(), candidates)
        room = has_room(candidates, 0.25, policy.params.min_bound_requests)
        chosen = [c.replica_id for c in candidates].index(decision.replica_id)
        if room[chosen] or not any(room):
            continue
        kept += 1
        row = decision.scores[chosen]
        assert min(s.score for s, ok in zip(decision.scores, room) if ok) - row.score > row.wait_s
    assert 0 < kept < 250


def test_has_room_is_the_bound_per_candidate() -> None:
    """The bound's limit is computed once per distinct weight: the same answers as per candidate."""
    rng = random.Random(2)
    for _ in range(300):
        candidates = [
            Candidate(
                f"r{i}",
                in_flight=rng.randint(0, 12),
                running=rng.randint(0, 3),
                weight=rng.choice([1.0, 1.0, 0.5, 2.0, 3.0]),
            )
            for i in range(rng.randint(1, 8))
        ]
        epsilon, floor = rng.choice([0.0, 0.25, 1.0]), rng.choice([0, 2, 4])
        mean = (sum(c.load * c.weight for c in candidates) + 1) / sum(c.weight for c in candidates)
        expected = [
            c.load * c.weight + 1 <= max(math.ceil((1 + epsilon) * mean * c.weight - 1e-9), floor) for c in candidates
        ]
        assert has_room(candidates, epsilon, floor) == expected
        assert has_room_loads([c.load for c in candidates], [c.weight for c in candidates], epsilon, floor) == expected


def reference_choice(policy: PrefixAffinityPolicy, view: RequestView, candidates: list[Candidate]) -> tuple[str, str]:
    """The choice rule spelled out candidate by candidate, from the policy's own state (no side effects)."""
    p, now = policy.params, policy.cost.clock()
    prompt = max(view.prompt_tokens_estimate, max(c.cached_tokens for c in candidates))
    has_home = max(c.cached_tokens for c in candidates) > view.preamble_tokens + view.tokens_per_block
    discount = (
        1.0 - p.preamble_weight
        if not has_home and policy._spread(view, [c.cached_tokens for c in candidates], now)
        else 0.0
    )
    effective = [
        predict(policy.cost, c, prompt, now)[1]
        + discount * min(c.cached_tokens, view.preamble_tokens) * policy.cost.prefill_s_per_token(c.replica_id)
        + p.eviction_weight
        * c.cache_fill
        * policy.cost.prefill_s_per_token(c.replica_id)
        * max(0, view.preamble_tokens - c.cached_tokens)
        for c in candidates
    ]
    waits = [predict(policy.cost, c, prompt, now)[0] for c in candidates]
    ttfts = [predict(policy.cost, c, prompt, now)[1] for c in candidates]
    home = policy._homes.get(view.preamble_key) if view.preamble_tokens else None
    home_held = (
        home in [c.replica_id for c in candidates] and max(x.cached_tokens for x in candidates) < view.preamble_tokens
    )
    for i, c in enumerate(candidates):  # what its prefill delays the requests behind it there
        n = c.cached_tokens
        if home_held and c.replica_id == home:
            n = max(n, int(p.home_credit * view.preamble_tokens))
        elif not home_held and discount and n < view.preamble_tokens:
            n += int(discount * (view.preamble_tokens - n))
        x = policy.cost.prefill_s_per_token(c.replica_id) * max(0, prompt - n)
        rate = policy._recent_works([c.replica_id], now)[0] / p.balance_window_s
        effective[i] += p.delay_weight * x * (waits[i] + x) * rate
    room = has_room(candidates, p.load_epsilon, p.min_bound_requests)
    eligible = [i for i, ok in enumerate(room) if ok] or list(range(len(candidates)))
    best = min(effective[i] for i in eligible)
    if len(eligible) < len(candidates):  # over the bound: kept where moving costs more than (1 + margin) × waiting
        fastest = min(ttfts[i] for i in eligible)
        full = not has_home and sum(c.cache_fill for c in candidates) >= p.full_cache_fill * len(candidates)
        margin = 0.0 if full else p.bound_margin
        eligible += [i for i, ok in enumerate(room) if not ok and fastest - ttfts[i] > margin * waits[i]]
        best = min(effective[i] for i in eligible)
    near = [i for i in eligible if effective[i] <= best + max(p.tie_s, p.tie_ratio * best)]
    if not has_home and policy._conversational(now):  # a new conversation: the least full cache first
        near = [i for i in near if candidates[i].cache_fill <= min(candidates[j].cache_fill for j in near) + 0.01]
    keys = {i: (candidates[i].load, policy._recent_works([candidates[i].replica_id], now)[0]) for i in near}
    tied = [i for i in near if keys[i] == min(keys.values())]
    if len(tied) > 1:
        return "tie", ""
    pick = tied[0]
    if len(eligible) < len(candidates) and min(effective) < effective[pick]:
        return candidates[pick].replica_id, "load_bound"
    common = max(min(c.cached_tokens for c in candidates), view.preamble_tokens)
    return candidates[pick].replica_id, "prefix_hit" if candidates[pick].cached_tokens > common else "least_wait"


@pytest.mark.parametrize("preamble_weight", [0.0, 0.5])
def test_choice_and_rows_match_the_rule_per_candidate(preamble_weight: float) -> None:
    """choose() computes in bulk; its rows and (untied) picks are the per-candidate rule's."""
    rng = random.Random(3)
    policy = prefix_policy(preamble_weight=preamble_weight, calibrate="replica")
    now = 100.0
    policy.cost.clock = lambda: now
    ids = [f"r{i}" for i in range(16)]
    for _ in range(300):
        now += rng.choice([0.0, 0.01, 0.5])
        view = make_view(prompt_tokens=rng.choice([100, 2000, 8000]))
        view.preamble_tokens, view.preamble_key, view.tokens_per_block = rng.choice([(0, 0), (512, 42)]) + (16.0,)
        candidates = [
            Candidate(
                r,
                in_flight=rng.randint(0, 8),
                waiting=rng.choice([0, 0, 2]),
                weight=rng.choice([1.0, 1.0, 2.0]),
                cached_tokens=rng.choice([0, view.preamble_tokens, rng.randint(0, 8000)]),
                cache_fill=rng.choice([0.0, 1.0]),
            )
            for r in rng.sample(ids, rng.randint(1, len(ids)))
        ]
        expected = reference_choice(policy, view, candidates)
        decision = policy.choose(view, candidates)
        prompt = max(view.prompt_tokens_estimate, max(c.cached_tokens for c in candidates))
        assert decision.scores == tuple(
            Score(
                c.replica_id,
                predict(policy.cost, c, prompt, now)[1],
                c.load,
                c.cached_tokens,
                predict(policy.cost, c, prompt, now)[0],
            )
            for c in candidates
        )
        if expected[0] != "tie":
            assert (decision.replica_id, decision.reason) == expected
        policy.on_dispatched(view, decision)
        if rng.random() < 0.3:
            policy.on_finished(
                view,
                decision.replica_id,
                Outcome(
                    ok=True,
                    ttft_s=rng.random(),
                    prompt_tokens=view.prompt_tokens_estimate,
                    predicted=next(s for s in decision.scores if s.replica_id == decision.replica_id),
                ),
            )


def test_near_ties_go_to_the_less_loaded() -> None:
    policy = prefix_policy(per_request_tokens=0.0)
    # a saves 10 tokens (2 ms, inside tie_s) but is busier: b wins.
    decision = policy.choose(make_view(), make_candidates(cached_tokens=[10, 0], in_flight=[1, 0]))
    assert decision.replica_id == "b"


def test_load_bound_reason() -> None:
    """a saves 300 tokens (0.06 s) but is over the bound with a predicted wait of 0.04 s: not enough to stay."""
    candidates = make_candidates(cached_tokens=[300, 0, 0, 0], in_flight=[4, 0, 0, 0])
    decision = prefix_policy().choose(make_view(), candidates)
    assert decision.replica_id != "a" and decision.reason == "load_bound"


def test_a_home_worth_its_queue_keeps_the_request_over_the_bound() -> None:
    """a holds 2000 of 2100 tokens: moving re-prefills 0.42 s, staying waits 0.04 s. The blunt bound
    moved it; the cost-aware one keeps it (bound_margin 0 would keep any cheaper stay)."""
    candidates = make_candidates(cached_tokens=[2000, 0, 0, 0], in_flight=[4, 0, 0, 0])
    assert prefix_policy().choose(make_view(), candidates).replica_id == "a"
    assert prefix_policy(bound_margin=100.0).choose(make_view(), candidates).reason == "load_bound"


def test_learns_from_finished_requests() -> None:
    policy = prefix_policy(learn_alpha=1.0)
    view = make_view(prompt_tokens=1000)
    chosen = dispatch(policy, view, make_candidates(cached_tokens=[0, 0, 0, 0]))
    predicted = Score(chosen, 0.2, cached_tokens=0, wait_s=0.0)
    policy.on_finished(
        view, chosen, Outcome(ok=True, ttft_s=0.5, prompt_tokens=1000, cached_tokens=0, predicted=predicted)
    )
    assert policy.cost.prefill_s_per_token(chosen) == pytest.approx(0.0005)
    policy.on_finished(view, chosen, Outcome(ok=False, ttft_s=9.0, predicted=predicted))
    assert policy.cost.prefill_s_per_token(chosen) == pytest.approx(0.0005)


def test_prefill_cost_is_learned_only_from_requests_sent_to_an_idle_replica() -> None:
    """Behind a queue, a TTFT is mostly waiting the prediction may have missed: learned as prefill
    cost, it swung the estimate 700x within one run (each wrong estimate mispredicting the next waits)."""
    policy = prefix_policy(learn_alpha=1.0)
    busy = make_view(prompt_tokens=1000)
    chosen = dispatch(policy, busy, make_candidates(in_flight=[3, 3, 3, 3]))
    policy.on_finished(
        busy,
        chosen,
        Outcome(ok=True, ttft_s=5.0, prompt_tokens=1000, cached_tokens=0, predicted=Score(chosen, 0.3, wait_s=0.03)),
    )
    assert policy.cost.prefill_s_per_token(chosen) == 0.0002
    idle = make_view(prompt_tokens=1000)
    chosen = dispatch(policy, idle, make_candidates(in_flight=[0, 0, 0, 0]))
    policy.on_finished(
        idle,
        chosen,
        Outcome(ok=True, ttft_s=0.5, prompt_tokens=1000, cached_tokens=0, predicted=Score(chosen, 0.2, wait_s=0.0)),
    )
    assert policy.cost.prefill_s_per_token(chosen) == pytest.approx(0.0005)


@pytest.mark.parametrize("delay_weight, expected", [(1.0, "a"), (0.0, "b")])
def test_near_saturation_a_preamble_goes_back_to_its_last_replica_instead_of_a_copy(
    delay_weight: float, expected: str
) -> None:
    """Every replica gets a request a second and the index thinks group 7's 2000-token prompt was
    evicted everywhere. b would answer 40 ms sooner; but re-prefilling it on b (0.42 s) delays the
    ~0.5 requests arriving at b meanwhile, and copies the group to a second cache. Its last replica
    a re-prefills it where it (likely) still is. Without the delay cost, b."""
    policy = prefix_policy(delay_weight=delay_weight)
    now = [1000.0]
    policy.cost.clock = lambda: now[0]
    policy.on_dispatched(preamble_view(2000, 2100, key=7), Decision("a", "test"))
    for _ in range(60):  # one request a second to each replica, for the last minute
        now[0] += 0.25
        for replica in IDS:
            other = 10**9 + next(_ids)  # never group 7, however many ids earlier tests drew
            policy.on_dispatched(preamble_view(2000, 2100, key=other), Decision(replica, "test"))
    decision = policy.choose(preamble_view(2000, 2100, key=7), make_candidates(in_flight=[7, 3, 7, 7]))
    assert decision.replica_id == expected


def test_first_token_releases_the_queued_prefill_before_the_answer_ends() -> None:
    policy = prefix_policy(prefill_s_per_token=0.01, per_request_tokens=0.0, learn_alpha=0.0)
    now = [100.0]
    policy.cost.clock = lambda: now[0]
    view = make_view(prompt_tokens=2000)
    chosen = dispatch(policy, view, make_candidates(cached_tokens=[0, 0, 0, 0]))
    assert wait_s(policy.cost, Candidate(chosen), now[0]) == pytest.approx(20.0)  # 2000 tokens queued
    now[0] += 1.0
    policy.on_first_token(view, chosen)  # prefilled 19 s sooner than predicted; the answer goes on
    assert wait_s(policy.cost, Candidate(chosen), now[0]) == 0.0
    policy.on_finished(view, chosen, Outcome(ok=True))  # the end releases nothing twice
    assert wait_s(policy.cost, Candidate(chosen), now[0]) == 0.0


def test_prefix_params_validation() -> None:
    with pytest.raises(ConfigError) as err:
        build_policy("prefix_affinity", {"load_epsilon": -1}, "pools.m.routing")
    assert err.value.key == "pools.m.routing.params.load_epsilon"


def preamble_view(preamble: int = 500, prompt: int = 2000, key: int = 42) -> RequestView:
    view = make_view(prompt_tokens=prompt)
    view.preamble_tokens, view.preamble_key = preamble, key
    return view
