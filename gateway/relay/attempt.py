"""One try of a request on one replica, and how a try fails: what the attempt loop
(`gateway.serving.attempts`) decides and what the relay (`gateway.relay.proxy`) reports back."""

from __future__ import annotations

from collections.abc import Callable

from gateway.errors import GatewayError
from gateway.replicas import Replica, ReplicaPool
from gateway.request.decision import Decision
from gateway.support.records import record


@record
class Attempt:
    """One try of a request on one replica, as the attempt loop (gateway.serving.attempts) decided it."""

    replica: Replica
    pool: ReplicaPool  # the replica's: its breakers eject at most `health.max_ejection_percent` of it
    decision: Decision
    after_fault: bool  # an earlier attempt failed as the input may cause: a second such failure is poison
    final: bool  # the last the retry limit allows
    others_left: Callable[[], bool]  # would a retry find a replica this request has not tried?

    @property
    def last(self) -> bool:
        """No retry left: a 5xx is the client's answer (and its replica's breaker charge), not retried. Asked
        only when the attempt failed, so a request that succeeds never looks for another replica."""
        return self.final or not self.others_left()


class Retryable(Exception):
    """An attempt failed before any byte reached the client; another replica may answer."""

    def __init__(self, error: GatewayError, kind: str) -> None:
        super().__init__(error.message)
        self.error, self.kind = error, kind


_INPUT_FAULTS = frozenset(("reset", "first_byte", "idle"))  # with every http_5xx: see input_may_cause


def input_may_cause(kind: str) -> bool:
    """Whether a failure of this kind may come from the request itself: a reset after it was sent, silence,
    a 5xx. A refused or timed-out connect, or a replica ejected by its probes, says nothing about the input."""
    return kind in _INPUT_FAULTS or kind.startswith("http_")
