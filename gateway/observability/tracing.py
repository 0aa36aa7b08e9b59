"""OpenTelemetry traces of proxied requests (YAML `tracing`), off by default.

One trace per request: a SERVER span continuing the client's `traceparent`, with the routing decision as
attributes and TTFT as an event; children for each admission wait, each routing decision and each upstream
attempt (a CLIENT span per retry, whose context goes to the replica as `traceparent`). The request's trace
id is bound into structlog's context vars, so every event logged while it runs carries `trace_id`.

Nothing here imports opentelemetry until a `Tracing` is built: a gateway with tracing off never loads it,
registers no tracing observer, and its requests carry the null trace (`gateway.request.exchange.NO_TRACE`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, MutableMapping
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from aiohttp import web

from gateway.config.sections import TracingConfig
from gateway.request.exchange import NO_TRACE, Exchange, FinishedRequest, RequestTrace
from gateway.request.observers import RequestObserver

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span

    from gateway.request.decision import Decision
    from gateway.view import RequestView

T = TypeVar("T")


class Tracing(RequestObserver):
    """The app's tracer, on a provider of its own (never the global one: apps and tests do not share spans);
    as an observer, it marks each request's first byte and ends its server span."""

    def __init__(self, config: TracingConfig, exporter: SpanExporter | None = None) -> None:
        """`exporter` replaces the OTLP one, exporting each span as it ends (tests: the in-memory exporter)."""
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name}),
            sampler=ParentBased(TraceIdRatioBased(config.sampling_ratio)),
        )
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            endpoint = config.endpoint.rstrip("/")
            exporter = OTLPSpanExporter(endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces")
            self.provider.add_span_processor(BatchSpanProcessor(exporter))
        else:
            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("affinity-gateway")
        self.propagator = TraceContextTextMapPropagator()
        self._ratio = config.sampling_ratio

    def request(self, request: web.Request, view: RequestView, started: float) -> RequestTrace:
        """Open the request's server span, back-dated to `started` (a perf_counter reading). A request with no
        `traceparent` that the ratio does not sample gets the null trace instead, as the sampler would have
        dropped its spans: tracing that samples few requests costs the others a header lookup, not a
        non-recording span tree (and the replica gets no `traceparent` for a trace nobody records). A client's
        `traceparent` is followed through the SDK, sampled or not."""
        if "traceparent" not in request.headers and not self._root_sampled():
            return NO_TRACE
        return SpanTrace(self, request, view, started)

    def _root_sampled(self) -> bool:
        """TraceIdRatioBased's verdict for a new trace: its trace id is random, so a uniform draw is the same."""
        return self._ratio >= 1.0 or random.random() < self._ratio

    def first_byte(self, exchange: Exchange, replica_id: str) -> None:
        exchange.trace.first_byte(exchange.ttft_s or 0.0, replica_id)

    def finished(self, done: FinishedRequest) -> None:
        """Close the server span (after the request's log event, which carries the trace id)."""
        done.trace.end(done)

    def shutdown(self) -> None:
        """Flush what is buffered to the collector (at the app's cleanup)."""
        self.provider.shutdown()


class SpanTrace(RequestTrace):
    """One request's spans; its methods are the hooks of serving.admission, serving.attempts and relay.proxy."""

    def __init__(self, tracing: Tracing, request: web.Request, view: RequestView, started: float) -> None:
        from opentelemetry.trace import SpanKind, set_span_in_context

        self._tracing = tracing
        parent = tracing.propagator.extract(request.headers)
        attributes: dict[str, Any] = {
            "http.request.method": request.method,
            "url.path": request.path,
            "gateway.model": view.model,
            "gateway.endpoint": view.endpoint,
            "gateway.stream": view.stream,
            "gateway.request_id": view.request_id,
        }
        if operation := _GEN_AI_OPERATIONS.get(view.endpoint):  # OpenTelemetry's GenAI names beside ours
            attributes["gen_ai.operation.name"], attributes["gen_ai.request.model"] = operation, view.model
        if view.adapter:
            attributes["gateway.adapter"] = view.adapter
        if view.tenant:
            attributes["gateway.tenant"] = view.tenant
        self.span = tracing.tracer.start_span(
            f"{request.method} {request.path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=_epoch_ns(started),
        )
        self._context = set_span_in_context(self.span, parent)
        self._attempt: Span | None = None
        self._attempts = 0
        self.trace_id = format(self.span.get_span_context().trace_id, "032x")
        structlog.contextvars.bind_contextvars(trace_id=self.trace_id)

    async def admission(self, waiting: Awaitable[T]) -> T:
        """A wait for a free slot (gateway.serving.admission): as long as the pool's queue held the request."""
        with self._tracing.tracer.start_as_current_span("admission", context=self._context):
            return await waiting

    async def routing(self, deciding: Awaitable[Decision], policy: str) -> Decision:
        """One routing decision, with what it was based on."""
        with self._tracing.tracer.start_as_current_span("route", context=self._context) as span:
            decision = await deciding
            span.set_attributes(_decision(decision, policy))
            return decision

    async def attempt(self, replica_id: str, url: str, sending: Awaitable[T], exchange: Exchange) -> T:
        """One upstream attempt, to its answer's end; its context is what `inject` sends the replica."""
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self._attempts += 1
        span = self._attempt = self._tracing.tracer.start_span(
            f"upstream {replica_id}",
            context=self._context,
            kind=SpanKind.CLIENT,
            attributes={"gateway.replica": replica_id, "gateway.attempt": self._attempts, "server.address": url},
        )
        try:
            result = await sending
        except BaseException as exc:
            span.set_attribute("gateway.outcome", getattr(exc, "kind", type(exc).__name__))
            span.set_status(Status(StatusCode.ERROR, str(exc) or type(exc).__name__))
            raise
        else:
            span.set_attribute("http.response.status_code", exchange.status)
            span.set_attribute(
                "gateway.outcome",
                "ok"
                if exchange.error is None and exchange.status < 500
                else exchange.error or f"http_{exchange.status}",
            )
            return result
        finally:
            span.end()

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """The attempt's `traceparent` replaces the client's: the replica's spans are the attempt's children."""
        from opentelemetry.trace import set_span_in_context

        if self._attempt is not None:
            self._tracing.propagator.inject(headers, context=set_span_in_context(self._attempt))

    def first_byte(self, ttft_s: float, replica_id: str) -> None:
        self.span.add_event("first_byte", {"gateway.ttft_s": ttft_s, "gateway.replica": replica_id})

    def end(self, done: FinishedRequest) -> None:
        from opentelemetry.trace import Status, StatusCode

        span = self.span
        span.set_attribute("http.response.status_code", done.status)
        if done.decision is not None:
            span.set_attributes(_decision(done.decision, done.routing.policy))
        if done.failed_replicas:
            span.set_attribute("gateway.retried_from", done.failed_replicas)
        if done.timing.ttft_s is not None:
            span.set_attribute("gateway.ttft_s", done.timing.ttft_s)
        if done.usage.prompt_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", done.usage.prompt_tokens)
        if done.usage.completion_tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", done.usage.completion_tokens)
        if done.status >= 500 or done.error is not None:
            span.set_status(Status(StatusCode.ERROR, done.error or f"status {done.status}"))
        span.end()
        structlog.contextvars.unbind_contextvars("trace_id")


# gen_ai.operation.name by endpoint (OpenTelemetry's GenAI semantic conventions).
_GEN_AI_OPERATIONS = {
    "chat": "chat",
    "messages": "chat",
    "responses": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
}


def _decision(decision: Decision, policy: str) -> dict[str, Any]:
    """The decision's attributes: the same facts as the request log event's."""
    attributes: dict[str, Any] = {
        "gateway.route.policy": policy,
        "gateway.route.replica": decision.replica_id,
        "gateway.route.reason": decision.reason,
    }
    if decision.evidence:
        attributes["gateway.route.evidence"] = decision.evidence
    chosen = decision.chosen()
    if chosen is not None:  # prefix_affinity's score is its predicted TTFT; others' are their own order
        attributes["gateway.route.predicted_ttft_s" if policy == "prefix_affinity" else "gateway.route.score"] = (
            chosen.score
        )
        attributes["gateway.route.predicted_cached_tokens"] = chosen.cached_tokens
        attributes["gateway.route.candidates"] = len(decision.scores)
    return attributes


def _epoch_ns(perf: float) -> int:
    """A perf_counter reading as the wall-clock nanoseconds spans are stamped with."""
    return time.time_ns() - int((time.perf_counter() - perf) * 1e9)
