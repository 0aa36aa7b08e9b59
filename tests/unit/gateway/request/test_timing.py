"""Seconds as logged: six decimals, as `round(value, 6)` gives them, without its cost."""

from __future__ import annotations

import math
import random

from hypothesis import given
from hypothesis import strategies as st

from gateway.request.decision import Decision, Score
from gateway.request.timing import micro, rounded


@given(st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False))
def test_micro_is_round_to_six_decimals_within_a_tie(value: float) -> None:
    """A value whose seventh decimal is a tie may round either way (`round` decides on the exact decimal)."""
    assert abs(micro(value) - round(value, 6)) <= 1e-6 + 4 * math.ulp(value)


def test_micro_agrees_with_round_over_the_range_a_request_logs() -> None:
    draw = random.Random(7)
    values = [draw.random() * 10 ** draw.uniform(-7, 4) for _ in range(100_000)]
    assert [micro(v) for v in values] == [round(v, 6) for v in values]


def test_micro_keeps_what_it_cannot_scale() -> None:
    assert micro(math.inf) == math.inf and math.isnan(micro(math.nan))
    assert micro(2.0**60) == 2.0**60  # past 2**52 every float is whole: nothing to round
    assert rounded(None) is None and rounded(0.1234564) == 0.123456


def test_the_decision_rows_are_rounded_as_logged() -> None:
    decision = Decision("a", "least_wait", (Score("a", 0.123456789, 1.0, 16, 0.000987654321),))
    assert decision.candidates() == [
        {"replica": "a", "score": 0.123457, "load": 1.0, "cached_tokens": 16, "wait_s": 0.000988}
    ]
