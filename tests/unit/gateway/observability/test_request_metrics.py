"""A finished request's metrics, from the one observer that records them."""

from __future__ import annotations

from gateway.config.features import ApiKeyConfig
from gateway.config.loader import parse_config
from gateway.config.pools import RoutingConfig
from gateway.observability.metrics import Metrics
from gateway.observability.request_metrics import RequestMetrics
from gateway.request.caller import ANONYMOUS, Caller
from gateway.request.exchange import NO_TRACE, FinishedRequest
from gateway.request.timing import Timing
from gateway.request.usage import Usage
from gateway.view import RequestView

CONFIG = parse_config({"pools": {"m1": {"replicas": [{"url": "http://127.0.0.1:9"}]}}})
KEY = "0" * 64  # a client key's sha256, as the config holds it


def _done(
    replica_id: str | None, status: int, failed: tuple[str, ...], usage: Usage, timing: Timing, caller: Caller
) -> FinishedRequest:
    view = RequestView("id-1", "chat", "m1", True, {}, b"{}")
    return FinishedRequest(
        view,
        CONFIG,
        "m1",
        RoutingConfig(),
        None,
        caller,
        replica_id,  # type: ignore[arg-type]
        None,
        failed,
        status,
        None,
        True,
        usage,
        timing,
        None,
        NO_TRACE,
    )


def test_a_retried_stream_of_a_tenant_counts_its_outcome_retries_and_tokens() -> None:
    metrics = Metrics()
    usage = Usage(prompt_tokens=30, completion_tokens=11)
    RequestMetrics(metrics).finished(
        _done(
            "r1", 200, ("r0",), usage, Timing.of(0.0, 0.2, 1.2, True, 11), Caller(ApiKeyConfig(sha256=KEY, tenant="t"))
        )
    )
    sample = metrics.registry.get_sample_value
    assert sample("affinity_gateway_requests_total", {"model_name": "m1", "replica": "r1", "status": "200"}) == 1
    assert sample("affinity_gateway_retries_total", {"model_name": "m1"}) == 1
    assert sample("affinity_gateway_ttft_seconds_count", {"model_name": "m1"}) == 1
    assert sample("affinity_gateway_tokens_per_second_count", {"model_name": "m1"}) == 1
    assert sample("affinity_gateway_tenant_requests_total", {"tenant": "t", "status": "200"}) == 1
    assert sample("affinity_gateway_tenant_tokens_total", {"tenant": "t", "kind": "prompt"}) == 30
    assert sample("affinity_gateway_tenant_tokens_total", {"tenant": "t", "kind": "completion"}) == 11


def test_a_request_no_replica_answered_counts_once_without_a_replica_or_a_tenant() -> None:
    metrics = Metrics()
    RequestMetrics(metrics).finished(_done(None, 503, (), Usage(), Timing.of(0.0, None, 0.01, False, None), ANONYMOUS))
    sample = metrics.registry.get_sample_value
    assert sample("affinity_gateway_requests_total", {"model_name": "m1", "replica": "", "status": "503"}) == 1
    assert sample("affinity_gateway_request_duration_seconds_count", {"model_name": "m1"}) == 1
    assert sample("affinity_gateway_ttft_seconds_count", {"model_name": "m1"}) is None
    assert sample("affinity_gateway_tenant_requests_total", {"tenant": "", "status": "503"}) is None
