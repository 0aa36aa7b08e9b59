"""The decision's copies with one field changed, made on every request."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.request.decision import Decision, Outcome, Score

pytestmark = pytest.mark.timeout(10)


def test_with_evidence_and_with_predicted_keep_every_other_field() -> None:
    """They stand in for `dataclasses.replace` on the request path: a field added later must be carried."""
    row = Score("r1", 0.5, 2.0, 64, 0.1)
    decision = Decision("r1", "prefix_hit", (row,), "", plan=("kept",))
    assert decision.with_evidence("exact") == dataclasses.replace(decision, evidence="exact")
    assert decision.with_evidence("exact").plan == ("kept",)
    outcome = Outcome(True, 0.2, 100, 64, 5, None, "answer")
    assert outcome.with_predicted(row) == dataclasses.replace(outcome, predicted=row)
    assert {f.name for f in dataclasses.fields(Decision)} == {"replica_id", "reason", "scores", "evidence", "plan"}
    assert len(dataclasses.fields(Outcome)) == 7
