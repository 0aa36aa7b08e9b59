from __future__ import annotations

import pytest

from replica_stub.engine.timing import TimingModel

T = TimingModel()


@pytest.mark.parametrize(
    ("n", "c", "expected"),
    [
        (1, 0, 28.3 + 0.362 + 0.812 * 0.5 / 1000),
        (1000, 0, 28.3 + 362 + 0.812 * 1000 * 500 / 1000),
        (100, 900, 28.3 + 36.2 + 0.812 * 100 * 950 / 1000),
    ],
    ids=["one-token", "1k-cold", "100-after-900-cached"],
)
def test_solo_prefill_matches_the_fitted_formula(n: int, c: int, expected: float) -> None:
    assert T.solo_prefill_ms(n, c) == pytest.approx(expected)
    assert T.step_ms([(n, c)], []) == pytest.approx(expected)


def test_cached_prefix_makes_prefill_cheaper() -> None:
    assert T.solo_prefill_ms(100, 900) < T.solo_prefill_ms(1000, 0) / 4


def test_chunked_prefill_costs_the_same_tokens_plus_one_base_per_chunk() -> None:
    whole = T.solo_prefill_ms(1000)
    chunks = T.solo_prefill_ms(500, 0) + T.solo_prefill_ms(500, 500)
    assert chunks == pytest.approx(whole + T.prefill_base_ms)


def test_single_decode_matches_the_formula() -> None:
    assert T.step_ms([], [1000]) == pytest.approx(22.3 + 21.0)


def test_batched_decode_is_cheaper_than_the_sum_of_solo_steps() -> None:
    contexts = [500] * 32
    batched = T.step_ms([], contexts)
    assert batched < sum(T.solo_decode_ms(c) for c in contexts) / 2
    assert batched > T.solo_decode_ms(500)


def test_mixed_step_pays_one_base() -> None:
    mixed = T.step_ms([(100, 0)], [200, 300])
    assert mixed == pytest.approx(T.solo_prefill_ms(100) + T.decode_ms(200) + T.decode_ms(300))


def test_empty_step_is_free_and_negative_settings_are_rejected() -> None:
    assert T.step_ms([], []) == 0
    with pytest.raises(ValueError, match="decode_base_ms"):
        TimingModel(decode_base_ms=-1).validate()
