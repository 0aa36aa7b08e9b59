"""Renderers of the commands that publish, on figures they have not published yet: what a first run
with `--results` would write must already read right (a lag past the last bucket, the mean over seeds)."""

from __future__ import annotations

import pytest

from bench import replica_concurrency, seeds, stress_matrix


@pytest.mark.timeout(10)
def test_seeds_are_a_range_or_a_list_and_the_mean_row_is_over_all_of_them() -> None:
    assert seeds.seed_list("0-3") == [0, 1, 2, 3] and seeds.seed_list("0,7") == [0, 7]
    figures = {"simulate": "-w hot-prefix", "seeds": {"0": {"a": [1.0, 2.0, 3.0]}, "1": {"a": [3.0, 4.0, 5.0]}}}
    assert seeds.render(figures).splitlines()[-1] == "| **mean** | **2.00 / 3.00 / 4.00** |"


@pytest.mark.timeout(10)
def test_a_lag_past_the_last_bucket_reads_as_unbounded_also_after_the_json_round_trip() -> None:
    run = {"completed": 10, "peak_running": 10.0, "steady_lag_p99_le_s": 0.04, "steady_lag_max_le_s": None}
    run |= {"ramp_lag_max_le_s": float("inf"), "lag_max_s": 0.0468, "replica_cpu_util": 0.39, "tokens_per_s": 9893.2}
    run |= {"ttft_p50_s": 0.68, "ttft_p99_s": 0.96}
    row = replica_concurrency.render({"streams": 10, "speedup": 100.0, "max_tokens": 200, "runs": [run]})
    assert row.splitlines()[-1] == (
        "| 1 | 10/10 | 10 | ≤ 40 ms | > largest bucket | > largest bucket | 46.8 ms | 0.39 | 9,893 | 0.68 / 0.96 |"
    )


@pytest.mark.timeout(10)
def test_the_stress_seeds_row_gives_the_medians_and_the_ratio_to_the_oracles_median() -> None:
    runs = {"0": [0.8, 0.9, 0.6], "1": [0.7, 0.7, 0.5], "2": [0.9, 0.8, 0.7]}  # burst_weight=0, default, oracle
    row = stress_matrix.render({"seeds": [0, 1, 2], "rows": [{"cell": "bursts", "seeds": runs}]}).splitlines()[-1]
    assert row == "| bursts | 800 → 900 | 700 → 700 | 900 → 800 | 800 → 800 | 600 | 1.33 |"
