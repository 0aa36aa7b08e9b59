"""gateway.observability.decision_log: a bounded ring, newest first, the chosen row's prediction next to the report."""

from __future__ import annotations

import pytest

from gateway.observability.decision_log import DecisionLog
from gateway.request.decision import Decision, Score
from gateway.request.timing import Timing
from gateway.request.usage import Usage

pytestmark = pytest.mark.timeout(10)


def test_the_latest_decisions_newest_first_with_predicted_and_reported_cached_tokens() -> None:
    log = DecisionLog(size=3)
    for i in range(5):
        decision = Decision("b", "prefix_hit", (Score("a", 0.2, 1.0, 0), Score("b", 0.1, 0.0, 64 * i)))
        log.record(
            "m", f"r{i}", 200, decision, Timing.of(0.0, 0.01, 0.05, True, 4), Usage(prompt_tokens=100, cached_tokens=60)
        )
    latest = log.latest(10)
    assert [d["request_id"] for d in latest] == ["r4", "r3", "r2"]
    assert latest[0]["predicted_cached_tokens"] == 256 and latest[0]["reported_cached_tokens"] == 60
    assert [c["replica"] for c in latest[0]["candidates"]] == ["a", "b"] and latest[0]["replica"] == "b"
    assert log.latest(1)[0]["request_id"] == "r4"
