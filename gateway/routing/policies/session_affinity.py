"""session_affinity: keep a session on its home replica while that stays cheap — a bonus, not a pin.

    score(r) = load(r) − bonus_requests × [r is the session's home]

The session key is the `X-Session-ID` header, `prompt_cache_key` or `user` (`view.session_key`).
Home = rendezvous hashing (highest xxh3(key, replica) wins): stateless, so every gateway agrees
on it, and removing a replica moves only its own sessions. The bounded-load rule
(`policies.bound`) keeps a busy home from taking more than (1 + load_epsilon) × the mean while
another replica has room. Requests without a key go to the least loaded replica.
Ties go to lower KV usage, then a random replica.

YAML:
    routing:
      policy: session_affinity
      params: {bonus_requests: 4, load_epsilon: 0.25}
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import xxhash

from gateway.config.policy_params import SessionAffinityPolicyConfig
from gateway.request.decision import Candidate, Decision, Score
from gateway.routing.policies.base import Policy
from gateway.routing.policies.bound import has_room
from gateway.view import RequestView


def home_replica(session_key: str, replica_ids: Sequence[str]) -> str:
    """Rendezvous hashing: the replica with the highest hash of (key, replica)."""
    return max(replica_ids, key=lambda rid: xxhash.xxh3_64_intdigest(f"{session_key}\x00{rid}".encode()))


class SessionAffinityPolicy(Policy):
    type = "session_affinity"

    def __init__(self, params: SessionAffinityPolicyConfig) -> None:
        super().__init__(params)
        self._rng = random.Random(params.seed)

    def choose(self, view: RequestView, candidates: Sequence[Candidate]) -> Decision:
        p = self.params
        home = home_replica(view.session_key, [c.replica_id for c in candidates]) if view.session_key else None
        rows = [
            Score(c.replica_id, c.load - (p.bonus_requests if c.replica_id == home else 0.0), load=c.load)
            for c in candidates
        ]
        room = has_room(candidates, p.load_epsilon, p.min_bound_requests)
        eligible = [i for i, ok in enumerate(room) if ok] or list(range(len(rows)))
        best = min((rows[i].score, candidates[i].kv_usage) for i in eligible)
        tied = [i for i in eligible if (rows[i].score, candidates[i].kv_usage) == best]
        pick = tied[0] if len(tied) == 1 else self._rng.choice(tied)
        chosen = rows[pick].replica_id
        if home is None:
            reason = "no_session"
        elif chosen == home:
            reason = "session_home"
        else:  # home was over the bound, or busier than the bonus covers
            reason = "load_bound" if home not in {rows[i].replica_id for i in eligible} else "least_loaded"
        return Decision(chosen, reason, tuple(rows))
