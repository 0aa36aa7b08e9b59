"""A finished request's Prometheus metrics, recorded by one observer, so that what a request counts for
cannot drift between the paths it may end by."""

from __future__ import annotations

from gateway.observability.metrics import Metrics
from gateway.request.exchange import FinishedRequest
from gateway.request.observers import RequestObserver


class RequestMetrics(RequestObserver):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def finished(self, done: FinishedRequest) -> None:
        """Its outcome, latencies and decode speed, retries, and the tenant's request and tokens."""
        m, model, usage, timing = self.metrics, done.view.model, done.usage, done.timing
        m.requests.labels(model, done.replica_id or "", str(done.status)).inc()
        if done.replica_id is not None and done.status == 200 and done.view.endpoint in ("chat", "completions"):
            m.cached_tokens_check.observe(model, done.replica_id, usage)
        m.latency.labels(model).observe(timing.total_s)
        if timing.ttft_s is not None:
            m.ttft.labels(model).observe(timing.ttft_s)
        if timing.tokens_per_s is not None:
            m.tokens_per_s.labels(model).observe(timing.tokens_per_s)
        if timing.itl_s is not None:
            m.itl.labels(model).observe(timing.itl_s)
        if done.first_phrase_s is not None:
            m.first_phrase.labels(model).observe(done.first_phrase_s)
        if done.failed_replicas:
            m.retries.labels(model).inc(len(done.failed_replicas))
        if (key := done.caller.key) is not None:
            m.tenant_requests.labels(key.tenant, str(done.status)).inc()
            for kind, tokens in (("prompt", usage.prompt_tokens), ("completion", usage.completion_tokens)):
                if tokens:
                    m.tenant_tokens.labels(key.tenant, kind).inc(tokens)
