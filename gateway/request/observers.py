"""Observers of requests: the features that learn from every request register here, once, instead of
being called one by one from the request handler.

    observers = Observers()
    observers.add(sessions)              # any object with some of the hooks below
    observers.first_byte(exchange, "r0")  # the answer's first byte came from r0
    observers.attempt_failed(exchange, "r0", "http_503", "replica r0 answered 503")
    observers.finished(done)             # a FinishedRequest, once per request

Each hook calls only the observers that define it, in the order they were added, so an observer with
one hook costs nothing at the others, and a feature that is off and never added costs nothing at all.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.request.exchange import Exchange, FinishedRequest

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

    def add(self, observer: object) -> None:
        """Register `observer` for each hook it defines (a `RequestObserver` subclass: each it overrides)."""
        for name, hooks in (
            ("first_byte", self._first_byte),
            ("attempt_failed", self._attempt_failed),
            ("finished", self._finished),
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
        for hook in self._finished:
            hook(done)
