"""A finished request's Prometheus metrics, recorded in one call (`gateway.serving.app._finished` makes it)."""

from __future__ import annotations

from gateway.edge.auth import Caller
from gateway.observability.metrics import Metrics
from gateway.observability.request_timing import Timing
from gateway.relay.proxy import Exchange
from gateway.view import RequestView


def record_finished(m: Metrics, view: RequestView, exchange: Exchange, timing: Timing, caller: Caller) -> None:
    """Its outcome, latencies and decode speed, retries, and the tenant's request and tokens; one place, so
    that what a request counts for cannot drift between the paths it may end by."""
    usage = exchange.usage
    m.requests.labels(view.model, exchange.replica_id or "", str(exchange.status)).inc()
    if exchange.replica_id is not None and exchange.status == 200 and view.endpoint in ("chat", "completions"):
        m.cached_tokens_check.observe(view.model, exchange.replica_id, usage)
    m.latency.labels(view.model).observe(timing.total_s)
    if exchange.ttft_s is not None:
        m.ttft.labels(view.model).observe(exchange.ttft_s)
    if timing.tokens_per_s is not None:
        m.tokens_per_s.labels(view.model).observe(timing.tokens_per_s)
    if timing.itl_s is not None:
        m.itl.labels(view.model).observe(timing.itl_s)
    if exchange.first_phrase_s is not None:
        m.first_phrase.labels(view.model).observe(exchange.first_phrase_s)
    if exchange.failed_replicas:
        m.retries.labels(view.model).inc(len(exchange.failed_replicas))
    if caller.key is not None:
        m.tenant_requests.labels(caller.key.tenant, str(exchange.status)).inc()
        for kind, tokens in (("prompt", usage.prompt_tokens), ("completion", usage.completion_tokens)):
            if tokens:
                m.tenant_tokens.labels(caller.key.tenant, kind).inc(tokens)
