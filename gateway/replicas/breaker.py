"""Circuit breaker: passive health of one replica, from the outcomes of real requests.

    closed     traffic flows; each upstream fault is timestamped
    open       `eject_after_failures` faults within `failure_window_s`: no traffic for a backoff that
               doubles with each consecutive opening (`backoff_s` .. `backoff_max_s`)
    half-open  the backoff is over: exactly one trial request may go; its success closes the
               breaker, its fault opens it again for twice as long

Only upstream faults count (connect errors, resets, 5xx, timeouts, streams broken mid-way); a client
that cancels or a 4xx answer says nothing about the replica. A trial that ends without a verdict
(the client left) frees the trial slot for the next request.

The pool may refuse an opening (`may_open`): it never ejects more than `health.max_ejection_percent`
of its replicas (`gateway.replicas.pool`). A refused opening keeps the faults, so the next fault
opens the breaker once the pool has room again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from gateway.support.backoff import doubled_s

State = Literal["closed", "open", "half_open"]
STATE_VALUES: dict[State, float] = {"closed": 0.0, "half_open": 1.0, "open": 2.0}  # the metric's encoding


@dataclass(slots=True)
class CircuitBreaker:
    faults: deque[float] = field(default_factory=deque)  # monotonic times of recent faults (closed state)
    openings: int = 0  # consecutive openings without a success in between; sets the backoff
    open_until: float = 0.0
    trial: bool = False  # half-open: the one trial request is in flight
    opened_total: int = 0

    def state(self, now: float) -> State:
        if now < self.open_until:
            return "open"
        return "half_open" if self.openings else "closed"

    def allows(self, now: float) -> bool:
        state = self.state(now)
        return state == "closed" or (state == "half_open" and not self.trial)

    def dispatched(self, now: float) -> bool:
        """A request is going to the replica; True when it is the half-open trial."""
        if self.state(now) == "half_open" and not self.trial:
            self.trial = True
            return True
        return False

    def end_trial(self) -> None:
        self.trial = False

    def fault(
        self, now: float, threshold: int, window_s: float, backoff_s: float, backoff_max_s: float, may_open: bool = True
    ) -> bool:
        """Count an upstream fault; True when this one opened the breaker (never when `may_open` is False and
        the breaker is closed)."""
        state = self.state(now)
        if state == "open":
            return False  # a request that started before the opening; already accounted for
        if state == "closed":
            self.faults.append(now)
            while self.faults and self.faults[0] <= now - window_s:
                self.faults.popleft()
            if len(self.faults) < threshold or not may_open:
                return False
        self.open_until = now + doubled_s(backoff_s, self.openings, backoff_max_s)
        self.openings += 1
        self.opened_total += 1
        self.faults.clear()
        self.trial = False
        return True

    def success(self, now: float) -> None:
        """A replica answer (any status below 500): closes a half-open breaker."""
        if self.state(now) == "half_open":
            self.openings, self.trial = 0, False
