"""Predicted-TTFT model: virtual prefill queue, scraped queue, online calibration."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import schema
from gateway.config.policy_params import CostModelConfig
from gateway.errors import ConfigError
from gateway.request.decision import Candidate
from gateway.routing.policies.cost import LOAD_SCALE_MAX, CostModel, LineFit
from tests.unit.gateway.routing.policies.predictions import predict, wait_s


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def model(**kw: Any) -> tuple[CostModel, Clock]:
    clock = Clock()
    return CostModel(CostModelConfig(**kw), clock), clock  # type: ignore[arg-type]


def test_idle_replica_predicts_prefill_of_uncached_tokens() -> None:
    cost, clock = model(prefill_s_per_token=0.001, per_request_tokens=0.0)
    wait, ttft = predict(cost, Candidate("a", cached_tokens=300), 1000, clock.now)
    assert wait == 0 and ttft == pytest.approx(0.7)


def test_dispatch_queues_prefill_that_drains_in_real_time() -> None:
    cost, clock = model(prefill_s_per_token=0.001, per_request_tokens=0.0)
    cost.dispatched("a", 1000)
    cost.dispatched("a", 500)
    assert wait_s(cost, Candidate("a"), clock.now) == pytest.approx(1.5)
    assert wait_s(cost, Candidate("b"), clock.now) == 0
    clock.now += 1.0
    assert wait_s(cost, Candidate("a"), clock.now) == pytest.approx(0.5)
    clock.now += 5.0
    assert wait_s(cost, Candidate("a"), clock.now) == 0
    cost.dispatched("a", 100)  # an idle replica starts from now, not from its old drain time
    assert wait_s(cost, Candidate("a"), clock.now) == pytest.approx(0.1)


def test_load_and_scraped_queue_add_wait() -> None:
    cost, clock = model(prefill_s_per_token=0.001, per_request_tokens=10.0, min_learn_tokens=64)
    assert wait_s(cost, Candidate("a", in_flight=3), clock.now) == pytest.approx(0.03)
    # Other clients' queued requests, costed at the mean prefill (starts at min_learn_tokens' worth).
    assert wait_s(cost, Candidate("a", waiting=10, running=0), clock.now) == pytest.approx(10 * 0.064 + 0.1)


def test_own_requests_in_the_scraped_queue_count_once() -> None:
    """The replica's queue holds this gateway's in-flight requests too: only the rest are other
    clients' work; ours is in the load term (and the virtual queue) already."""
    cost, clock = model(prefill_s_per_token=0.001, per_request_tokens=10.0, min_learn_tokens=64)
    ours = Candidate("a", in_flight=6, running=2, waiting=4)  # everything there is ours
    assert wait_s(cost, ours, clock.now) == pytest.approx(6 * 10 * 0.001)
    mixed = Candidate("a", in_flight=3, running=2, waiting=4)  # three of the six are someone else's
    assert wait_s(cost, mixed, clock.now) == pytest.approx(3 * 0.064 + 6 * 10 * 0.001)
    running_others = Candidate("a", in_flight=1, running=5, waiting=2)  # at most the waiting ones
    assert wait_s(cost, running_others, clock.now) == pytest.approx(2 * 0.064 + 7 * 10 * 0.001)


@pytest.mark.parametrize("calibrate", ["pool", "replica"])
def test_learns_prefill_cost_from_observed_ttft(calibrate: str) -> None:
    cost, _ = model(prefill_s_per_token=0.001, learn_alpha=0.2, calibrate=calibrate)
    for _ in range(60):
        cost.observe("a", ttft_s=0.1 + 1000 * 0.0004, uncached_tokens=1000, predicted_wait_s=0.1)
    assert cost.prefill_s_per_token("a") == pytest.approx(0.0004, rel=0.01)
    # The pool's replicas share what was learned; per-replica calibration keeps them apart.
    assert cost.prefill_s_per_token("b") == (0.001 if calibrate == "replica" else cost.prefill_s_per_token("a"))


def test_learning_skips_tiny_prefills_and_clamps_outliers() -> None:
    cost, _ = model(prefill_s_per_token=0.001, learn_alpha=1.0, min_learn_tokens=64, calibrate="replica")
    cost.observe("a", ttft_s=5.0, uncached_tokens=10, predicted_wait_s=0)
    assert cost.prefill_s_per_token("a") == 0.001
    cost.observe("a", ttft_s=1000.0, uncached_tokens=100, predicted_wait_s=0)
    assert cost.prefill_s_per_token("a") == pytest.approx(0.001 * CostModel.CLAMP)
    cost.forget("a")
    assert cost.prefill_s_per_token("a") == 0.001


def test_learning_can_be_disabled() -> None:
    cost, _ = model(learn_alpha=0.0)
    cost.observe("a", ttft_s=9.0, uncached_tokens=1000, predicted_wait_s=0)
    assert cost.prefill_s_per_token("a") == CostModelConfig().prefill_s_per_token


@pytest.mark.parametrize(
    "data,key",
    [
        ({"prefill_s_per_token": 0}, "c.prefill_s_per_token"),
        ({"learn_alpha": 2}, "c.learn_alpha"),
        ({"per_request_tokens": -1}, "c.per_request_tokens"),
    ],
    ids=["prefill", "alpha", "req"],
)
def test_params_validation(data: dict[str, float], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        schema.build(CostModelConfig, data, "c")
    assert err.value.key == key


def test_prefilled_request_releases_its_queued_prefill() -> None:
    cost, clock = model(prefill_s_per_token=0.001, per_request_tokens=0.0)
    first, _ = cost.dispatched("a", 1000)
    cost.dispatched("a", 500)
    clock.now += 0.2
    cost.prefilled("a", first)  # done 0.8 s sooner than predicted: the second moves up
    assert wait_s(cost, Candidate("a"), clock.now) == pytest.approx(0.5)
    cost.prefilled("a", clock.now - 1.0)  # finishing late changes nothing
    assert wait_s(cost, Candidate("a"), clock.now) == pytest.approx(0.5)


def test_first_samples_correct_a_far_off_default_at_once() -> None:
    cost, clock = model(prefill_s_per_token=0.001, learn_alpha=0.05)
    cost.observe("a", ttft_s=0.02 + 1000 * 0.00002, uncached_tokens=1000, predicted_wait_s=0.02)
    assert cost.prefill_s_per_token("a") == pytest.approx(0.00002)


def test_short_prefills_teach_the_fixed_part() -> None:
    cost, clock = model(prefill_s_per_token=0.001, per_request_tokens=0.0, learn_alpha=0.1, min_learn_tokens=64)
    for _ in range(5):
        cost.observe("a", ttft_s=0.03, uncached_tokens=10, predicted_wait_s=0.0)
    assert cost.prefill_s_per_token("a") == 0.001
    cost.observe("a", ttft_s=0.03 + 500 * 0.0001, uncached_tokens=500, predicted_wait_s=0.0)
    assert cost.prefill_s_per_token("a") == pytest.approx(0.0001)  # the fixed 30 ms is not per-token cost
    wait, ttft = predict(cost, Candidate("a"), 100, clock.now)
    assert ttft == pytest.approx(0.03 + 100 * 0.0001)


@pytest.mark.parametrize("calibrate", ["pool", "replica"])
def test_predict_many_is_predict_for_each_candidate(calibrate: str) -> None:
    """The batch form (what prefix_affinity calls per request) gives exactly the per-candidate formula."""
    cost, clock = model(prefill_s_per_token=0.0003, per_request_tokens=40.0, calibrate=calibrate)
    cost.observe("a", ttft_s=0.01, uncached_tokens=10, predicted_wait_s=0.0)  # a fixed part
    cost.observe("b", ttft_s=0.9, uncached_tokens=2000, predicted_wait_s=0.1)  # a learned per-token cost
    cost.dispatched("a", 3000)
    cost.dispatched("c", 10)
    clock.now += 0.5  # c's queue has drained, a's has not
    candidates = [
        Candidate("a", in_flight=2, cached_tokens=500),
        Candidate("b", waiting=3, running=1, weight=2.0),
        Candidate("c", cached_tokens=5000),
        Candidate("d", in_flight=1, waiting=4, cached_tokens=900),
    ]
    waits, ttfts, per_token = cost.predict_many(candidates, [c.load for c in candidates], 1000, clock.now)
    for c, wait, ttft, s_per_token in zip(candidates, waits, ttfts, per_token):
        foreign = min(c.waiting, max(0, c.running + c.waiting - c.in_flight))
        expected_wait = (
            max(max(0.0, cost._drain_at.get(c.replica_id, clock.now) - clock.now), foreign * cost._mean_prefill_s)
            + cost.params.per_request_tokens * cost.prefill_s_per_token(c.replica_id) * c.load
        )
        assert wait == expected_wait and wait == wait_s(cost, c, clock.now)
        assert s_per_token == cost.prefill_s_per_token(c.replica_id)
        assert ttft == expected_wait + cost._base_s + s_per_token * max(0, 1000 - c.cached_tokens)
        assert (wait, ttft) == predict(cost, c, 1000, clock.now)
    assert ttfts[2] == waits[2] + cost._base_s  # more cached than the prompt: nothing to prefill


def test_cancelled_prefill_leaves_the_queue() -> None:
    cost, clock = model(prefill_s_per_token=0.001, per_request_tokens=0.0)
    cost.dispatched("a", 1000)
    _, prefill_s = cost.dispatched("a", 500)
    cost.cancelled("a", prefill_s)  # the second never ran there
    assert wait_s(cost, Candidate("a"), clock.now) == pytest.approx(1.0)
    cost.cancelled("a", 5.0)  # never below empty
    assert wait_s(cost, Candidate("a"), clock.now) == 0.0


def test_prompts_of_many_sizes_teach_the_fixed_part_and_the_per_token_cost_apart() -> None:
    """A CPU engine's step costs a lot more than its tokens: with no short prompts to show it, the
    line through the (uncached tokens, TTFT) pairs does."""
    cost, clock = model(prefill_s_per_token=0.001, per_request_tokens=0.0, learn_alpha=0.1)
    for tokens in [60, 90, 120, 150, 180, 210, 240, 270] * 3:
        cost.observe("a", ttft_s=0.3 + 0.0026 * tokens, uncached_tokens=tokens, predicted_wait_s=0.0)
    assert cost.prefill_s_per_token("a") == pytest.approx(0.0026)
    assert cost._base_s == pytest.approx(0.3)
    # Seven queued prefills of 100 tokens share one step: one fixed part, not seven.
    for _ in range(7):
        cost.dispatched("a", 100)
    assert wait_s(cost, Candidate("a"), clock.now) == pytest.approx(0.3 + 7 * 0.26)


def test_prompts_of_one_size_fall_back_to_the_mean_cost() -> None:
    cost, _ = model(prefill_s_per_token=0.001, learn_alpha=0.1)
    for _ in range(20):
        cost.observe("a", ttft_s=0.56, uncached_tokens=100, predicted_wait_s=0.0)
    assert cost.prefill_s_per_token("a") == pytest.approx(0.0056)
    assert cost._base_s == 0.0


def test_the_fitted_line_never_has_a_negative_fixed_part() -> None:
    fit = LineFit()
    for tokens in [100, 1000] * 5:  # costs grow faster than the tokens (attention): the line meets y < 0
        fit.add(tokens, 0.000001 * tokens**2, 0.1)
    line = fit.line(0.0, 1.0)
    assert line is not None and line[0] == 0.0 and line[1] == pytest.approx(fit.mean_y / fit.mean_x)
    assert LineFit().line(0.0, 1.0) is None


def test_requests_in_flight_that_cost_less_than_their_price_teach_a_lower_one() -> None:
    """vLLM's CPU build: a running request added about a third of what `per_request_tokens` prices."""
    cost, clock = model(prefill_s_per_token=0.001, per_request_tokens=50.0, learn_alpha=0.1)
    priced = wait_s(cost, Candidate("a", in_flight=2), clock.now)
    assert priced == pytest.approx(2 * 50 * 0.001)
    for _ in range(30):  # each found two in flight, no prefill queued, and waited a third of their price
        cost.observe_loaded("a", ttft_s=priced / 3 + 0.1, uncached_tokens=100, predicted_wait_s=priced, scale=1.0)
    assert cost.load_scale == pytest.approx(1 / 3)
    assert wait_s(cost, Candidate("a", in_flight=2), clock.now) == pytest.approx(priced / 3)
    # Near the price, or dearer: the price stands (the simulator's engine, which it was tuned on).
    for _ in range(60):
        cost.observe_loaded(
            "a", ttft_s=0.1 + 0.9 * priced, uncached_tokens=100, predicted_wait_s=priced / 3, scale=1 / 3
        )
    assert cost.load_scale == 1.0 and cost._load_learned == pytest.approx(0.9, rel=0.01)
    for _ in range(60):
        cost.observe_loaded("a", ttft_s=5.0, uncached_tokens=100, predicted_wait_s=priced, scale=1.0)
    assert cost.load_scale == 1.0 and 0.99 < cost._load_learned <= LOAD_SCALE_MAX == 1.0
