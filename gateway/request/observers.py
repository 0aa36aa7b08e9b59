"""Observers of requests: the features that learn from every request register here, once, instead of
being called one by one from the request handler.

    observers = Observers()
    observers.add(router_feedback)       # any object with some of the hooks below
    observers.add(sessions, batched=True)  # hears of finished requests in a batch, after the answer went out
    observers.first_byte(exchange, "r0")  # the answer's first byte came from r0
    observers.attempt_failed(exchange, "r0", "http_503", "replica r0 answered 503")
    observers.finished(done)             # a FinishedRequest, once per request

Each hook calls only the observers that define it, in the order they were added, so an observer with
one hook costs nothing at the others, and a feature that is off and never added costs nothing at all.

Batched `finished` hooks (the request's metrics, log event and insights: what no later request reads
back) run once per event-loop turn over every request that finished since the last batch, one hook over
the whole batch before the next, with the request log's lines written in one go. Run so, the same work
costs the process about a tenth less CPU per proxied request than when it was interleaved with the
requests' own work (`python -m bench.hop`, whole answers, prefix_affinity): a hook's code and data stay
in the CPU's caches across the batch. It also no longer delays the answer. A batched hook runs in its
request's context (its log event carries the request's bound variables, e.g. the trace id), before
anything reads the next request that arrived on the loop: the batch is queued ahead of it. Hooks whose
result a later request reads (the router's learning, stored-response homes, rate-limit accounts) are
not batched.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

import structlog

from gateway.log import lines_together
from gateway.request.exchange import Exchange, FinishedRequest
from gateway.support.soon import Soon

log = structlog.get_logger("gateway.request.observers")

FirstByte = Callable[[Exchange, str], None]
AttemptFailed = Callable[[Exchange, str, str, str], None]
Finished = Callable[[FinishedRequest], None]


class RequestObserver:
    """Base of an observer, for documentation and type checks; define only the hooks you need."""

    def first_byte(self, exchange: Exchange, replica_id: str) -> None:
        """The answer's first byte came from `replica_id` (`exchange.ttft_s` is set)."""

    def attempt_failed(self, exchange: Exchange, replica_id: str, kind: str, error: str) -> None:
        """An attempt on `replica_id` failed before any byte reached the client (`kind`: timeout, http_503,
        ...); another may follow."""

    def finished(self, done: FinishedRequest) -> None:
        """The request ended, answered or not: once per request that reached routing."""


class Observers:
    """The registered observers, by hook."""

    def __init__(self) -> None:
        self._first_byte: list[FirstByte] = []
        self._attempt_failed: list[AttemptFailed] = []
        self._finished: list[Finished] = []
        self._batched: list[Finished] = []
        # finished requests in their contexts, for the batched hooks when the loop next turns
        self._batch: Soon[tuple[contextvars.Context, FinishedRequest]] = Soon(self._run_batched)

    def add(self, observer: object, *, batched: bool = False) -> None:
        """Register `observer` for each hook it defines (a `RequestObserver` subclass: each it overrides);
        `batched`: its `finished` hears of requests in a batch after their answers (module docstring)."""
        for name, hooks in (
            ("first_byte", self._first_byte),
            ("attempt_failed", self._attempt_failed),
            ("finished", self._batched if batched else self._finished),
        ):
            hook = getattr(observer, name, None)
            if hook is not None and getattr(type(observer), name, None) is not getattr(RequestObserver, name):
                hooks.append(hook)

    def first_byte(self, exchange: Exchange, replica_id: str) -> None:
        for hook in self._first_byte:
            hook(exchange, replica_id)

    def attempt_failed(self, exchange: Exchange, replica_id: str, kind: str, error: str) -> None:
        for hook in self._attempt_failed:
            hook(exchange, replica_id, kind, error)

    def finished(self, done: FinishedRequest) -> None:
        if not self._batched:
            for hook in self._finished:
                hook(done)
            return
        context = contextvars.copy_context()  # before a hook unbinds a variable of the request
        try:
            for hook in self._finished:
                hook(done)
        finally:
            self._batch.add((context, done))  # with no loop running: the batched hooks run now, after these

    def flush(self) -> None:
        """Run the batched hooks over the requests finished since the last batch now (the app's cleanup does,
        for a batch the loop stopped before)."""
        self._batch.flush()

    def _run_batched(self, batch: list[tuple[contextvars.Context, FinishedRequest]]) -> None:
        """Each batched hook over the whole batch, in each request's context. A failing hook is logged and
        skipped for that request only."""
        with lines_together():
            for hook in self._batched:
                for context, done in batch:
                    try:
                        context.run(hook, done)
                    except Exception:
                        log.exception("observer_failed", observer=getattr(hook, "__qualname__", repr(hook)))
