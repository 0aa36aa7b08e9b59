"""Immutable records made on every request, at the cost of a plain dataclass.

A frozen dataclass sets each field through `object.__setattr__` in its `__init__`: 3.4 µs for a 5-field
record and 7.9 µs for the 16 fields of a finished request on this project's machine, against 0.65 µs
for the same class unfrozen. About ten such records are made per proxied request. `record` is frozen for
the type checker (`dataclass_transform(frozen_default=True)`: mypy rejects an assignment to a field) and
a slotted dataclass at run time, hashable as a frozen one is (its fields are never assigned after
`__init__`, which mypy holds them to).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def record(cls: type[T]) -> type[T]:
    return dataclass(slots=True, unsafe_hash=True)(cls)
