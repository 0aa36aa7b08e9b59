"""Delays that double with each consecutive failure, up to a cap, and start over after a success: for
reconnect loops, watches, restarts and circuit breakers alike."""

from __future__ import annotations


def doubled_s(first_s: float, doublings: int, max_s: float) -> float:
    """`first_s` doubled `doublings` times, at most `max_s`."""
    return min(first_s * 2.0**doublings, max_s)


class Backoff:
    """The delay of a retry loop: `next_s()` before each retry, `reset()` after a success."""

    __slots__ = ("first_s", "max_s", "delay_s")

    def __init__(self, first_s: float, max_s: float) -> None:
        self.first_s, self.max_s = first_s, max_s
        self.delay_s = first_s  # the delay the next retry waits

    def next_s(self) -> float:
        """The delay to wait now; the one after it is doubled."""
        delay, self.delay_s = self.delay_s, min(self.delay_s * 2, self.max_s)
        return delay

    def reset(self) -> None:
        self.delay_s = self.first_s
