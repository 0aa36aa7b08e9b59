"""Labelled metrics whose children are looked up once: on the request path a `.labels(...)` call
of prometheus_client validates every value and takes a lock, several times per request, while the
child for the same values is always the same object (no metric of the gateway ever removes one)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from prometheus_client.metrics import MetricWrapperBase

M = TypeVar("M", bound=MetricWrapperBase)


class Children(Generic[M]):
    """Wraps a labelled metric: `.labels(*values)` from a dict after the first call; all else is the metric's."""

    __slots__ = ("metric", "_children")

    def __init__(self, metric: M) -> None:
        self.metric = metric
        self._children: dict[tuple[Any, ...], M] = {}

    def labels(self, *values: Any) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child

    def __getattr__(self, name: str) -> Any:
        return getattr(self.metric, name)
