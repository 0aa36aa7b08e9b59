"""One proxied request's record: the `Exchange` the attempt loop and the relay fill in while it runs, the
immutable `FinishedRequest` every observer reads once it ended, and the `RequestTrace` hooks it passes
through on the way (tracing off: the null trace, which passes everything through and records nothing)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

from gateway.request.caller import Caller
from gateway.request.decision import Decision, Outcome, Score
from gateway.request.timing import Timing
from gateway.request.usage import Usage
from gateway.support.records import record
from gateway.view import RequestView

if TYPE_CHECKING:
    from gateway.config.loader import Config
    from gateway.config.pools import PoolConfig, RoutingConfig, StreamChunkingConfig

T = TypeVar("T")


class RouterFeedback(Protocol):
    """What a request tells the router that decided it, as it goes (`gateway.routing.router.Router`)."""

    def first_token(self, view: RequestView, replica_id: str) -> None: ...

    def finished(self, view: RequestView, replica_id: str, outcome: Outcome) -> Score | None: ...

    def record_answer(self, view: RequestView, replica_id: str, outcome: Outcome) -> None: ...

    def prefill_s_per_token(self, replica_id: str) -> float | None: ...


class RequestTrace:
    """A request's trace hooks. This base is tracing off: each hook hands its work back untouched, so a
    request pays one call per hook and no span (`gateway.observability.tracing` records them)."""

    def admission(self, waiting: Awaitable[T]) -> Awaitable[T]:
        return waiting

    def routing(self, deciding: Awaitable[Decision], policy: str) -> Awaitable[Decision]:
        return deciding

    def attempt(self, replica_id: str, url: str, sending: Awaitable[T], exchange: Exchange) -> Awaitable[T]:
        return sending

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Tracing off: a client's traceparent goes on as it came."""

    def first_byte(self, ttft_s: float, replica_id: str) -> None:
        pass

    def end(self, done: FinishedRequest) -> None:
        pass


NO_TRACE = RequestTrace()


@dataclass(slots=True)
class Exchange:
    """What happened to one request upstream, written as it goes by the attempt loop
    (`gateway.serving.attempts`) and the relay (`gateway.relay.proxy`); `finished` freezes it."""

    view: RequestView
    router: RouterFeedback  # the router that decides it, to the end (a reload keeps it until then)
    on_first_byte: Callable[[Exchange, str], None]  # the observers' first-byte hook
    started: float = field(default_factory=time.perf_counter)
    replica_id: str | None = None
    decision: Decision | None = None
    failed_replicas: list[str] = field(default_factory=list)
    status: int = 0
    streamed: bool = False
    queue_s: float = 0.0  # waiting for a slot and deciding, every attempt's (gateway.request.timing)
    ttft_s: float | None = None  # first upstream body byte (streams) or response headers (whole bodies)
    usage: Usage = field(default_factory=Usage)
    error: str | None = None
    poison: bool = False  # a second replica answered 5xx: the request's fault, charged to no breaker
    chunking: StreamChunkingConfig | None = None  # the stream is re-chunked in phrases (relay.phrase_chunking)
    first_phrase_s: float | None = None  # the first phrase written to the client, chunked streams only
    strip_usage: bool = False  # the gateway asked for this stream's usage: the client did not (relay.stream_usage)
    trace: RequestTrace = NO_TRACE

    def first_byte(self, replica_id: str) -> None:
        """The answer's first byte came from `replica_id`: its time to first token is taken."""
        self.ttft_s = time.perf_counter() - self.started
        self.on_first_byte(self, replica_id)

    def phrase_written(self) -> None:
        if self.first_phrase_s is None:
            self.first_phrase_s = time.perf_counter() - self.started

    def finished(self, config: Config, model: str, routing: RoutingConfig, caller: Caller) -> FinishedRequest:
        """The record of the request as it ended, for the observers."""
        usage = self.usage
        timing = Timing.of(
            self.queue_s, self.ttft_s, time.perf_counter() - self.started, self.streamed, usage.completion_tokens
        )
        return FinishedRequest(
            self.view,
            config,
            model,
            routing,
            self.router,
            caller,
            self.replica_id,
            self.decision,
            tuple(self.failed_replicas),
            self.status,
            self.error,
            self.streamed,
            usage,
            timing,
            self.first_phrase_s,
            self.trace,
        )


@record
class FinishedRequest:
    """One request as it ended: what every finished-request observer reads, and nothing writes."""

    view: RequestView
    config: Config  # the config it ran under
    model: str  # the pool that served it (`view.model` after an alias or a pattern)
    routing: RoutingConfig
    router: RouterFeedback
    caller: Caller
    replica_id: str | None  # the last replica tried; None when none was
    decision: Decision | None  # the committed decision of that last attempt
    failed_replicas: tuple[str, ...]  # the replicas tried before it
    status: int
    error: str | None
    streamed: bool
    usage: Usage
    timing: Timing
    first_phrase_s: float | None
    trace: RequestTrace

    @property
    def ok(self) -> bool:
        return 0 < self.status < 500 and self.error is None

    @property
    def pool(self) -> PoolConfig | None:
        return self.config.pools.get(self.model)
