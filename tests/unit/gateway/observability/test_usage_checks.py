"""The one-time warning for replicas whose usage never carries cached_tokens (no --enable-prompt-tokens-details)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from gateway.observability.usage_checks import CachedTokensCheck
from gateway.request.usage import Usage

pytestmark = pytest.mark.timeout(30)


def test_many_answers_without_cached_tokens_flip_the_gauge_once() -> None:
    registry = CollectorRegistry()
    check = CachedTokensCheck(registry, after=3)
    for _ in range(5):
        check.observe("m", "bare", Usage(prompt_tokens=10, completion_tokens=2))
        check.observe("m", "bare", Usage())  # no usage at all: not counted
    check.observe("m", "flagged", Usage(prompt_tokens=10))
    check.observe("m", "flagged", Usage(prompt_tokens=10, cached_tokens=0))
    for _ in range(5):
        check.observe("m", "flagged", Usage(prompt_tokens=10))  # once seen, a missing count is the version's guard
    value = registry.get_sample_value
    assert value("affinity_gateway_replica_cached_tokens_reported", {"model_name": "m", "replica": "bare"}) == 0
    assert value("affinity_gateway_replica_cached_tokens_reported", {"model_name": "m", "replica": "flagged"}) == 1
