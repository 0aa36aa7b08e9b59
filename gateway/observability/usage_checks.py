"""Warn once when a replica's answers never say how many prompt tokens were cached.

vLLM fills `usage.prompt_tokens_details.cached_tokens` only when started with
`--enable-prompt-tokens-details` (and some versions only when the count is not 0), so one answer
without it proves nothing; `after` answers with usage and not one with the count do. Without it
the gateway cannot check its predictions (`affinity_gateway_route_cached_tokens_error_tokens`
stays empty) and the cost model never sees a hit. Exported as
`affinity_gateway_replica_cached_tokens_reported{model,replica}`: 1 once an answer carried it,
0 once `after` answers did not.
"""

from __future__ import annotations

import structlog
from prometheus_client import CollectorRegistry, Gauge

from gateway.request.usage import Usage

log = structlog.get_logger("gateway.observability.usage_checks")


class CachedTokensCheck:
    def __init__(self, registry: CollectorRegistry, after: int = 20) -> None:
        self.after = after
        self._without: dict[tuple[str, str], int] = {}  # answers with usage but no cached count; -1: seen one
        self.reported = Gauge(
            "affinity_gateway_replica_cached_tokens_reported",
            "1 once the replica's usage "
            "carried prompt_tokens_details.cached_tokens, 0 after many answers without it "
            "(vLLM: --enable-prompt-tokens-details)",
            ["model_name", "replica"],
            registry=registry,
        )

    def observe(self, model: str, replica_id: str, usage: Usage) -> None:
        if usage.prompt_tokens is None:
            return  # no usage at all (a stream without include_usage): nothing to judge
        key = (model, replica_id)
        count = self._without.get(key, 0)
        if count < 0:
            return
        if usage.cached_tokens is not None:
            self._without[key] = -1
            self.reported.labels(model, replica_id).set(1)
            return
        self._without[key] = count + 1
        if count + 1 == self.after:
            self.reported.labels(model, replica_id).set(0)
            log.warning(
                "cached_tokens_absent",
                model=model,
                replica=replica_id,
                answers=self.after,
                detail="the replica's usage never carries prompt_tokens_details.cached_tokens: start vLLM "
                "with --enable-prompt-tokens-details (and --enable-prefix-caching), else the "
                "gateway cannot check its cache predictions",
            )
