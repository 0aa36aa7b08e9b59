"""Conversations between turns: the requests a replica will see shortly that no queue shows yet.

A conversation whose answer just ended on a replica sends its next turn there after the user's think
time. Until it does, the replica looks idle, and a new conversation's long first prefill placed there
lands in front of that turn. `BetweenTurns` counts, per replica, the conversation turns that ended there
and have not come back yet (a decayed count: a conversation that never returns is forgotten within
`window_s`), and prices what a prefill of x seconds costs them: each returns within about `window_s`,
so during the prefill with probability x / window_s, and then waits x / 2 on average. Only
`prefix_affinity` with `return_weight` > 0 keeps these counts.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.policies.decayed import decayed, decayed_each
from gateway.support.bounded import put_newest
from gateway.view import RequestView

MAX_TRACKED = 100_000  # conversation turns in flight remembered until they end (bounds a leak)


class BetweenTurns:
    """Per replica, the conversations whose last turn ended there and that have not sent the next one."""

    def __init__(self, weight: float, window_s: float) -> None:
        self.weight = weight
        self.window_s = window_s
        self._waiting: dict[str, tuple[float, float]] = {}  # replica -> (decayed count, as of time)
        self._turns: dict[str, str] = {}  # request id of a conversation's turn in flight -> its replica

    def dispatched(self, request_id: str, replica_id: str, returning: bool, conversational: bool, now: float) -> None:
        """A request went to `replica_id`: a returning turn is no longer between turns; a conversation's turn
        (returning or starting one) is tracked until it ends."""
        if returning:
            left = decayed(self._waiting, replica_id, now, self.window_s) - 1.0
            self._waiting[replica_id] = (left if left > 0.0 else 0.0, now)
        if conversational:
            put_newest(self._turns, request_id, replica_id, MAX_TRACKED)

    def ended(self, request_id: str, replica_id: str, ok: bool, now: float) -> None:
        """A request's answer is over: if it was a conversation's turn answered there, its next turn is due."""
        tracked = self._turns.pop(request_id, None)
        if ok and tracked == replica_id:
            self._waiting[replica_id] = (decayed(self._waiting, replica_id, now, self.window_s) + 1.0, now)

    def forget(self, request_id: str) -> None:
        """An attempt that never ran (it is retried elsewhere and tracked there)."""
        self._turns.pop(request_id, None)

    def prices(
        self, ids: Sequence[str], per_token: Sequence[float], cached: Sequence[int], prompt: int, now: float
    ) -> list[float]:
        """Each candidate's expected delay to its returning turns if this prompt's prefill were placed there."""
        window, weight = self.window_s, self.weight
        waiting = decayed_each(self._waiting, ids, now, window)
        out = []
        for count, s_per_token, n in zip(waiting, per_token, cached):
            x = s_per_token * (prompt - n if prompt > n else 0)
            out.append(weight * count * x * x / (2.0 * window))
        return out


def continues(view: RequestView) -> bool:
    """Does the chat request carry an earlier answer (a later turn, an agent's next hop)?"""
    messages = view.body.get("messages") if view.endpoint == "chat" else None
    return isinstance(messages, list) and any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages)
