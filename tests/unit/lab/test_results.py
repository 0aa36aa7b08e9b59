"""Summaries of several runs: the median row of `bench --compare --rounds N`."""

from __future__ import annotations

import pytest

from lab.results import Result, median_of, summarise, table


def _run(ttfts: list[float], replica: str, later: bool = True) -> list[Result]:
    return [
        Result("s", turn=i if later else 0, ok=True, ttft_s=t, e2e_s=t + 1, replica=replica, prompt_tokens=10)
        for i, t in enumerate(ttfts)
    ]


@pytest.mark.timeout(10)
def test_each_figure_is_the_median_of_the_runs_and_counts_stay_whole() -> None:
    runs = [
        summarise(_run([1.0] * 10, "a"), replicas=["a", "b"]),
        summarise(_run([2.0] * 10, "a") + _run([2.0] * 2, "b"), replicas=["a", "b"]),
        summarise(_run([9.0] * 10, "b"), replicas=["a", "b"]),  # one noisy run moves nothing
    ]
    merged = median_of(runs)
    assert merged.ttft_p90_s == 2.0 and merged.e2e_p90_s == 3.0
    assert merged.requests == 10 and isinstance(merged.requests, int)
    assert merged.replica_share == {"a": 10, "b": 0}  # the run of the median busiest / mean (2.0, 1.67, 2.0)


@pytest.mark.timeout(10)
def test_a_router_that_piles_on_a_different_replica_each_round_reads_as_piling() -> None:
    runs = [summarise(_run([1.0] * 6, name), replicas=["a", "b"]) for name in ("a", "b")]
    merged = median_of(runs)
    assert merged.busiest_over_mean == 2.0 and sum(merged.replica_share.values()) == 6
    balanced = summarise(_run([1.0] * 3, "a") + _run([1.0] * 3, "b"), replicas=["a", "b"])
    assert median_of([runs[0], balanced]).busiest_over_mean == 1.0  # the lower of two


@pytest.mark.timeout(10)
def test_a_figure_only_some_runs_have_is_the_median_of_those() -> None:
    runs = [
        summarise(_run([1.0, 3.0], "a"), replicas=["a"]),
        summarise(_run([5.0], "a", later=False), replicas=["a"]),  # first turns only: no later-turn p90
    ]
    assert runs[1].later_ttft_p90_s is None
    assert median_of(runs).later_ttft_p90_s == runs[0].later_ttft_p90_s


@pytest.mark.timeout(10)
def test_answers_that_name_no_replica_leave_the_share_unknown_not_lopsided() -> None:
    """A router in front of vLLM names no replica: its spread is not known, where it read 3.00 for two replicas."""
    unnamed = summarise(_run([1.0] * 6, ""), replicas=["a", "b"])
    assert unnamed.replica_share == {"a": 0, "b": 0} and unnamed.busiest_over_mean == 0.0
    assert "| 0.000 | - |" in table({"peer": unnamed})
    assert "| 1.00 |" in table({"ours": summarise(_run([1.0] * 2, "a") + _run([1.0] * 2, "b"), replicas=["a", "b"])})


@pytest.mark.timeout(10)
def test_a_published_run_renders_as_its_summary_and_a_transcribed_one_shows_what_it_lacks_as_dashes() -> None:
    """The published table renders from to_dict(); a run transcribed from an older page has only that page's figures."""
    summary = summarise(_run([1.0] * 2, "a") + _run([1.0] * 2, "b"), replicas=["a", "b"])
    assert table({"ours": summary.to_dict()}) == table({"ours": summary})
    transcribed = {"requests": 12, "errors": 0, "ttft_p50_s": 1.5, "ttft_p90_s": 3.6, "busiest_over_mean": 1.5}
    row = table({"old": transcribed}).splitlines()[-1]
    assert row.startswith("| old | 12 | 0 | 1.500 | 3.600 | - | - | - |") and "| 1.50 |" in row
