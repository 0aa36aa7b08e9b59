"""A finished request's metrics, from the one call that records them."""

from __future__ import annotations

from gateway.config.features import ApiKeyConfig
from gateway.edge.auth import ANONYMOUS, Caller
from gateway.observability.metrics import Metrics
from gateway.observability.request_metrics import record_finished
from gateway.observability.request_timing import Timing
from gateway.relay.proxy import Exchange
from gateway.view import RequestView


def _view() -> RequestView:
    return RequestView("id-1", "chat", "m1", True, {}, b"{}")


def test_a_retried_stream_of_a_tenant_counts_its_outcome_retries_and_tokens() -> None:
    metrics, exchange = Metrics(), Exchange(replica_id="r1", status=200, ttft_s=0.2, failed_replicas=["r0"])
    exchange.usage.prompt_tokens, exchange.usage.completion_tokens = 30, 11
    timing = Timing.of(0.0, 0.2, 1.2, True, 11)
    record_finished(metrics, _view(), exchange, timing, Caller(ApiKeyConfig(tenant="t")))
    sample = metrics.registry.get_sample_value
    assert sample("affinity_gateway_requests_total", {"model": "m1", "replica": "r1", "status": "200"}) == 1
    assert sample("affinity_gateway_retries_total", {"model": "m1"}) == 1
    assert sample("affinity_gateway_ttft_seconds_count", {"model": "m1"}) == 1
    assert sample("affinity_gateway_tokens_per_second_count", {"model": "m1"}) == 1
    assert sample("affinity_gateway_tenant_requests_total", {"tenant": "t", "status": "200"}) == 1
    assert sample("affinity_gateway_tenant_tokens_total", {"tenant": "t", "kind": "prompt"}) == 30
    assert sample("affinity_gateway_tenant_tokens_total", {"tenant": "t", "kind": "completion"}) == 11


def test_a_request_no_replica_answered_counts_once_without_a_replica_or_a_tenant() -> None:
    metrics, exchange = Metrics(), Exchange(status=503)
    record_finished(metrics, _view(), exchange, Timing.of(0.0, None, 0.01, False, None), ANONYMOUS)
    sample = metrics.registry.get_sample_value
    assert sample("affinity_gateway_requests_total", {"model": "m1", "replica": "", "status": "503"}) == 1
    assert sample("affinity_gateway_request_duration_seconds_count", {"model": "m1"}) == 1
    assert sample("affinity_gateway_ttft_seconds_count", {"model": "m1"}) is None
    assert sample("affinity_gateway_tenant_requests_total", {"tenant": "", "status": "503"}) is None
