"""One candidate's prediction through `CostModel.predict_many`, the only form the policies use."""

from __future__ import annotations

from gateway.request.decision import Candidate
from gateway.routing.policies.cost import CostModel


def predict(cost: CostModel, candidate: Candidate, prompt_tokens: int, now: float) -> tuple[float, float]:
    """(wait_s, predicted_ttft_s) of sending a `prompt_tokens` prompt to `candidate`."""
    waits, ttfts, _ = cost.predict_many([candidate], [candidate.load], prompt_tokens, now)
    return waits[0], ttfts[0]


def wait_s(cost: CostModel, candidate: Candidate, now: float) -> float:
    return predict(cost, candidate, 0, now)[0]
