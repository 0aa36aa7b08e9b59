"""Silence limits on an upstream attempt, and cutting attempts loose (replica ejected, gateway stopping).

An attempt's first byte (a stream's first body chunk; a whole answer's headers) must come within
`timeouts.first_byte_s` of sending it; after that no gap between upstream bytes may exceed
`timeouts.idle_s`. One timer for all attempts (`Watches`), set for the earliest time any of them could be
due: a chunk only records the time it came (the hot path costs one clock read), an attempt adds and
removes itself from a dict, and the timer, when it fires, cuts those due and is set again for the next.
A timer per attempt cost more than the rest of its bookkeeping: uvloop's `call_later` and `cancel`, twice
per request, are among the dearest calls a request makes (docs/benchmarks/hop.md).

A cut (the timer, a replica ejected by its health probes, the end of the shutdown grace period) makes
the wait in progress fail where the proxy already handles it: before the response headers the request's
own timeout fires at once; after them the upstream response is closed, so the body read raises.
`kind` says why ("first_byte", "idle", "ejected", "shutdown").

A connection lost mid-body fails the body's read itself (`gateway.relay.upstream`).
"""

from __future__ import annotations

import asyncio
import math

from gateway.relay.upstream import UpstreamAnswer


class Watch:
    """One attempt on one replica; registered in `Watches` for its lifetime, which checks it for silence."""

    __slots__ = (
        "replica_id",
        "kind",
        "message",
        "last",
        "_watches",
        "_loop",
        "_started",
        "_first_byte_s",
        "_idle_s",
        "_request",
        "_upstream",
    )

    def __init__(
        self, watches: Watches, loop: asyncio.AbstractEventLoop, replica_id: str, first_byte_s: float, idle_s: float
    ) -> None:
        self._watches, self._loop = watches, loop
        self.replica_id, self._first_byte_s, self._idle_s = replica_id, first_byte_s, idle_s
        self.kind: str | None = None
        self.message = ""
        self.last: float | None = None  # loop time of the latest upstream byte; None before the first
        self._started = loop.time()
        self._request: asyncio.Timeout | None = None
        self._upstream: UpstreamAnswer | None = None

    def sending(self) -> asyncio.Timeout:
        """The timeout to wrap the wait for response headers in (fired by a cut)."""
        self._request = asyncio.timeout(None)
        return self._request

    def answered(self, upstream: UpstreamAnswer, *, first_byte: bool) -> None:
        self._request, self._upstream = None, upstream
        if first_byte:
            self.touch()

    def touch(self) -> None:
        """A byte came: from now on the idle limit applies."""
        first = self.last is None
        self.last = self._loop.time()
        if first:  # the only change that can bring its time due forward
            self._watches.due_by(self.last + self._idle_s)

    def due(self) -> float:
        """The loop time at which its silence is over the limit (infinite once cut)."""
        if self.kind is not None:
            return math.inf
        return self._started + self._first_byte_s if self.last is None else self.last + self._idle_s

    def expire(self) -> None:
        """Its time is due: cut it for the silence (the message is formatted only for a cut)."""
        if self.last is None:
            self.cut("first_byte", f"no first byte in {self._first_byte_s:g}s")
        else:
            self.cut("idle", f"no byte from the replica for {self._idle_s:g}s")

    def cut(self, kind: str, message: str) -> None:
        if self.kind is not None:
            return
        self.kind, self.message = kind, message
        if self._request is not None:
            self._request.reschedule(self._loop.time())
        elif self._upstream is not None:
            self._upstream.close()


async def read_whole(upstream: UpstreamAnswer, most: int, watch: Watch) -> bytes | None:
    """A whole answer's body; None when it is over `most` bytes (said by its Content-Length, or found on
    the way: the pieces read are dropped at once). Memory holds at most `most` bytes of pieces and their
    join. Every piece re-arms the idle limit, as a stream's chunks do: a body slow but moving is not silent
    (it was cut `idle_s` after the headers)."""
    if (upstream.content_length or 0) > most:
        return None
    pieces: list[bytes] = []
    size = 0
    while piece := await upstream.read_any():
        watch.touch()
        size += len(piece)
        if size > most:
            return None
        pieces.append(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


class Watches:
    """Every attempt in flight, so a replica's (or all) can be cut at once; and the one timer that cuts the
    silent ones (module docstring)."""

    def __init__(self) -> None:
        self._live: dict[Watch, None] = {}  # a dict: adding and removing one costs less than a set's
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf  # when the timer fires; no attempt is due before

    def start(self, replica_id: str, first_byte_s: float, idle_s: float) -> Watch:
        loop = asyncio.get_running_loop()
        watch = Watch(self, loop, replica_id, first_byte_s, idle_s)
        self._live[watch] = None
        self.due_by(watch.due())
        return watch

    def end(self, watch: Watch) -> None:
        self._live.pop(watch, None)

    def due_by(self, at: float) -> None:
        """An attempt may be due at loop time `at`: the timer fires by then. Later ones change nothing (under
        load the timer is already set earlier, so an attempt costs no timer of its own)."""
        if at < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = at
            self._timer = asyncio.get_running_loop().call_at(at, self._sweep)

    def _sweep(self) -> None:
        """The timer fired: cut every attempt due, then set it for the earliest of the rest."""
        self._timer, self._timer_at = None, math.inf
        now = asyncio.get_running_loop().time()
        earliest = math.inf
        for watch in list(self._live):
            due = watch.due()
            if due <= now:
                watch.expire()
            elif due < earliest:
                earliest = due
        if earliest < math.inf:
            self.due_by(earliest)

    def cut(self, kind: str, message: str, replica_id: str | None = None) -> int:
        """Cut the attempts on `replica_id` (None: all); returns how many."""
        chosen = [w for w in self._live if replica_id is None or w.replica_id == replica_id]
        for watch in chosen:
            watch.cut(kind, message)
        return len(chosen)
