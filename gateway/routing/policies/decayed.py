"""Counts that fade: recent requests per replica or per preamble, each stored as (count, as of time) and
decayed exponentially with a time constant when read, so "recent" needs no timers and no sweeps."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def decay(entry: tuple[float, float] | None, now: float, window_s: float) -> float:
    """A count that decays with time constant `window_s`, stored as (count, as of time)."""
    count, since = entry or (0.0, now)
    return count if since == now else count * math.exp((since - now) / window_s)  # exp(0) = 1 exactly


def decayed(counts: Mapping[K, tuple[float, float]], key: K, now: float, window_s: float) -> float:
    """`key`'s count in `counts`, decayed to `now` (0 for a key never counted)."""
    return decay(counts.get(key), now, window_s)


def decayed_each(
    counts: Mapping[K, tuple[float, float]], keys: Sequence[K], now: float, window_s: float
) -> list[float]:
    """`decayed` for each of `keys` (a policy reads every candidate's on every request)."""
    get = counts.get
    return [decay(get(key), now, window_s) for key in keys]
