"""prefix_affinity: send each request where its predicted time to first token is lowest.

    predicted_ttft(r) = wait(r) + prefill_s_per_token × (prompt_tokens − cached_tokens(r))
    choice: argmin over r of predicted_ttft(r) + discount × prefill_s_per_token
            × min(cached_tokens(r), preamble_tokens) + delay(r), among replicas within the load bound
    delay(r) = delay_weight × x(r) × (wait(r) + x(r)) × r's recent arrival rate, x(r) its prefill:
               what the prefill costs the requests that will queue behind it (`_delays`)
    discount = 1 − preamble_weight for a new conversation (no replica holds more than the
               preamble) whose preamble deserves more holders than it has, else 0
    holders wanted = ceil(replicas × the preamble's share of recent requests × preamble_spread),
               once `shared_preamble_requests` requests carried it lately (else 1)

Inputs: `cached_tokens` from the warm-prefix index (the Router fills it), load and scraped queue
from the pool, the virtual prefill queue and learned prefill cost from `gateway.routing.policies.cost`.
Cache benefit and load are in one unit, decided per request and per candidate — no fleet-wide
"imbalanced, ignore the cache" switch. Overlap every candidate holds shifts every score equally
and attracts nothing. The chat preamble (tools + system prompt, shared by many conversations)
is replicated in proportion to its traffic: while fewer replicas hold it than its share of
recent requests calls for, holding it attracts no *new* conversation (it spreads, so one popular
system prompt makes no hot spot); once enough hold it, it attracts with its true prefill cost
(so 64 groups' long prompts each stay on a few replicas instead of thrashing every cache). A
preamble seen only a few times (one conversation's own system prompt) is not replicated. Once a
conversation has a home (a replica holds its text past the preamble, or the request carries an
earlier answer), the true TTFT decides: the home holds its history *and* the preamble, and
another replica would have to prefill both. A bounded-load rule (`policies.bound`) keeps any
replica under (1 + load_epsilon) × the mean while another has room, so a hot prefix spreads; once
the caches are full (`full_cache_fill`), a request without a conversation of its own stays on its
prompt's home over the bound unless it would be slower there outright (a moved prompt evicts
another's: under capacity pressure the bound cost hits, and hits are the fleet's throughput).
Candidates within `tie_s` (or `tie_ratio` of the best) are tied: a new conversation, where most
traffic continues conversations (`conversation_share`), goes to the least full cache of them (its
later turns will queue behind the conversations homed there); then the least loaded wins, then the
one sent the fewest requests lately, then a random one. Each dispatch lengthens the replica's
virtual queue, so even a burst of identical requests arriving before any load update spreads.
With `return_weight` > 0 a new conversation also pays for the later turns it would delay (`conversations`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from gateway.config.policy_params import PrefixAffinityPolicyConfig
from gateway.request.decision import Candidate, Decision, Outcome, Score
from gateway.routing.policies.base import Policy
from gateway.routing.policies.bound import has_room_loads
from gateway.routing.policies.conversations import BetweenTurns, continues
from gateway.routing.policies.cost import CostModel
from gateway.routing.policies.decayed import decay, decayed, decayed_each
from gateway.support.bounded import put_newest
from gateway.view import RequestView

MAX_TRACKED = 100_000  # dispatched requests remembered until they finish (bounds a leak if one never does)
FILL_TIE = 0.01  # cache fills this close count as equal


class PrefixAffinityPolicy(Policy):
    type = "prefix_affinity"
    needs_prefix = True
    needs_index = True

    def __init__(self, params: PrefixAffinityPolicyConfig) -> None:
        super().__init__(params)
        self.cost = CostModel(params)
        self._rng = random.Random(params.seed)
        # Requests sent where none of this gateway's prefills was queued: with nothing in flight there their
        # TTFTs teach the prefill cost, with requests in flight the price of those (`CostModel.observe_loaded`).
        # Behind a queue, any error in the predicted wait would be learned as a slower or faster
        # prefill, and the next waits predicted with it: an estimate that feeds on itself.
        self._unqueued: dict[str, tuple[str, float, float]] = {}  # request id -> (replica, load, load scale)
        # Each preamble's last replica (view.preamble_key -> replica id), oldest first; bounded.
        self._homes: dict[int, str] = {}
        # The prompt tokens of each request in flight, and where (the cost model sums them per replica).
        self._in_flight: dict[str, tuple[str, int, int]] = {}  # request id -> (replica, preamble, prompt); bounded
        # Expected prefill completion of each dispatched request, until it finishes (bounded).
        self._done_at: dict[str, tuple[str, float, float]] = {}  # request -> (replica, done at, prefill_s)
        # Requests recently sent to each replica: (count, as of time), decaying over balance_window_s.
        self._recent: dict[str, tuple[float, float]] = {}
        # The same, per preamble (view.preamble_key, 0 = all requests), oldest first; bounded.
        self._preambles: dict[int, tuple[float, float]] = {}
        # Recent requests that continued a conversation (had a home), decaying as the counts above.
        self._continuing: tuple[float, float] = (0.0, 0.0)
        self._between = BetweenTurns(params.return_weight, params.return_window_s) if params.return_weight else None

    def choose(self, view: RequestView, candidates: Sequence[Candidate]) -> Decision:
        # One pass per quantity over the candidates, everything per-request looked up once: this
        # runs on every request for every replica (64 replicas: well under a millisecond).
        now = self.cost.clock()
        ids = [c.replica_id for c in candidates]
        cached = [c.cached_tokens for c in candidates]
        loads = [c.load for c in candidates]
        most_cached = max(cached)
        prompt = max(view.prompt_tokens_estimate, most_cached)
        # A home: some replica holds this conversation's own text, past the block that straddles
        # the end of the preamble (that one is often shared too, e.g. a common first-message opening).
        # A chat request that already holds an answer continues a conversation, whatever the block
        # size (with 128-token blocks a few short turns stay inside the straddling block).
        has_home = most_cached > view.preamble_tokens + view.tokens_per_block or continues(view)
        discount = 1.0 - self.params.preamble_weight if not has_home and self._spread(view, cached, now) else 0.0
        starts_conversation = not has_home and self._conversational(now)  # its later turns will come back
        homed = has_home or starts_conversation  # single requests alone are priced by their group in flight
        waits, ttfts, per_token = self.cost.predict_many(
            candidates,
            loads,
            prompt,
            now,
            view.preamble_key if self._prices_context(candidates, homed) else None,
            0 if homed else view.preamble_key,
        )
        rows = tuple(map(Score, ids, ttfts, loads, cached, waits))  # (replica_id, score, load, cached_tokens, wait_s)
        effective = self._effective(view, candidates, cached, ttfts, per_token, discount)
        recent = self._recent_works(ids, now) if self.params.delay_weight else None  # the delays' and ties' input
        if recent is not None:
            delays = self._delays(view, ids, cached, waits, per_token, prompt, recent, discount)
            effective = [e + d for e, d in zip(effective, delays)]
        if starts_conversation and self._between is not None:
            returns = self._between.prices(ids, per_token, cached, prompt, now)
            effective = [e + r for e, r in zip(effective, returns)]
        eligible, best = self._within_bound(candidates, loads, ttfts, waits, effective, has_home)
        near = self._near_best(candidates, eligible, effective, best, starts_conversation)
        pick = self._tie_broken(ids, loads, near, now, recent)
        # The prompt, candidates, their cached tokens and loads, and whether it had a home: on_dispatched
        # queues the chosen one's uncached prefill from them.
        return Decision(
            ids[pick],
            self._reason(view, cached, effective, eligible, pick),
            rows,
            plan=(prompt, ids, cached, loads, has_home),
        )

    def _effective(
        self,
        view: RequestView,
        candidates: Sequence[Candidate],
        cached: list[int],
        ttfts: list[float],
        per_token: list[float],
        discount: float,
    ) -> list[float]:
        """Each candidate's predicted TTFT, plus what its choice costs beyond it: a shared preamble that wants
        more holders is discounted, and writing one into a full cache is charged for what it evicts."""
        effective = ttfts  # + 0 × the preamble's prefill: the same numbers
        if discount:
            preamble = view.preamble_tokens
            effective = [
                ttft + discount * (n if n < preamble else preamble) * s_per_token
                for ttft, n, s_per_token in zip(ttfts, cached, per_token)
            ]
        if self.params.eviction_weight and view.preamble_tokens:
            # Writing a shared preamble into a full cache evicts as much warm prefix, which someone
            # re-prefills later, while the preamble's other holders keep their copy: a duplicate.
            # (A conversation's own history is no such cost: it moves with the conversation, and
            # the copy it leaves behind is dead.)
            weight, preamble = self.params.eviction_weight, view.preamble_tokens
            effective = [
                e + weight * c.cache_fill * s_per_token * (preamble - n if preamble > n else 0)
                for e, c, n, s_per_token in zip(effective, candidates, cached, per_token)
            ]
        return effective

    def _within_bound(
        self,
        candidates: Sequence[Candidate],
        loads: list[float],
        ttfts: list[float],
        waits: list[float],
        effective: list[float],
        has_home: bool,
    ) -> tuple[list[int], float]:
        """The candidates within the bounded load, with the over-bound ones that are plainly worth their queue;
        and the best effective cost among them."""
        p = self.params
        room = has_room_loads(loads, [c.weight for c in candidates], p.load_epsilon, p.min_bound_requests)
        if all(room) or not any(room):
            return list(range(len(effective))), min(effective)
        eligible = [i for i, ok in enumerate(room) if ok]
        best = min([effective[i] for i in eligible])
        # Over the bound, a replica still keeps the request when moving costs more than staying
        # would even if its predicted wait were `bound_margin` times longer: the bound guards
        # against a wrong wait estimate, not against a home that is plainly worth its queue.
        # Predicted TTFTs decide that, not the costs to others: a queue is paid in TTFT (keeping
        # by the full score held long prompts on saturated replicas, and their tail grew).
        # Full caches: a prompt moved off its home evicts another's there, and someone re-prefills it.
        full = not has_home and sum([c.cache_fill for c in candidates]) >= p.full_cache_fill * len(candidates)
        margin, fastest = 0.0 if full else p.bound_margin, min([ttfts[i] for i in eligible])
        keep = [i for i, ok in enumerate(room) if not ok and fastest - ttfts[i] > margin * waits[i]]
        if keep:
            eligible = sorted(eligible + keep)
            best = min(best, min([effective[i] for i in keep]))
        return eligible, best

    def _near_best(
        self,
        candidates: Sequence[Candidate],
        eligible: list[int],
        effective: list[float],
        best: float,
        starts_conversation: bool,
    ) -> list[int]:
        """The eligible candidates within the tie margin of the best."""
        cutoff = best + max(self.params.tie_s, self.params.tie_ratio * best)
        near = [i for i in eligible if effective[i] <= cutoff]
        if starts_conversation and len(near) > 1:
            # A new conversation will come back: its later turns queue behind the conversations already
            # homed where it lands, and need cache room there. The least full cache has the fewest.
            least_fill = min([candidates[i].cache_fill for i in near])
            near = [i for i in near if candidates[i].cache_fill <= least_fill + FILL_TIE]
        return near

    def _tie_broken(
        self, ids: list[str], loads: list[float], near: list[int], now: float, recent: list[float] | None
    ) -> int:
        """Near-ties: the least loaded, then the one given the least recent work (new conversations spread
        evenly, so their later turns do too), then a random one. `recent`: each candidate's recent work, if
        the delays needed it already."""
        if len(near) == 1:
            return near[0]
        least_load = min([loads[i] for i in near])
        tied = [i for i in near if loads[i] == least_load]
        if len(tied) > 1:  # only these need their recent work
            if recent is None:
                recent = self._recent_works(ids, now)
            least = min([recent[i] for i in tied])
            tied = [i for i in tied if recent[i] == least]
        return tied[0] if len(tied) == 1 else self._rng.choice(tied)

    @staticmethod
    def _reason(view: RequestView, cached: list[int], effective: list[float], eligible: list[int], pick: int) -> str:
        if len(eligible) < len(effective) and min(effective) < effective[pick]:
            return "load_bound"  # the fastest-looking replica was over the bound
        common = max(min(cached), view.preamble_tokens)
        return "prefix_hit" if cached[pick] > common else "least_wait"

    def _prices_context(self, candidates: Sequence[Candidate], homed: bool) -> bool:
        """Does the in-flight context (`CostModel`'s `context_weight`) count in this request's predicted waits?

        For single requests that are not tied to a home: a burst of a tenant's prompts then spills as the
        home's batch grows, before its queue does. Not for a conversation's later turn (its home holds its
        history: a miss re-prefills all of it), nor for a new one where most traffic is conversations (its
        placement is its later turns' home), nor once the caches are full (a prompt moved evicts another's,
        and the bound's full-cache rule keeps it home for that reason): there the per-request price alone
        kept the tails lower (agent-loop, tenant-chat, prefix-groups in docs/benchmarks/peers.md). `homed`: it has
        a home, or its placement will be its later turns' home."""
        if homed:
            return False
        fill = sum([c.cache_fill for c in candidates])
        return bool(fill < self.params.full_cache_fill * len(candidates))

    def _spread(self, view: RequestView, cached: Sequence[int], now: float) -> bool:
        """Should this preamble go to more replicas than hold it now? Yes while its share of the
        recent traffic wants more holders; a rarely seen preamble (one conversation's) wants one.
        `cached`: each candidate's warm prefix, in tokens."""
        if not view.preamble_key or not view.preamble_tokens:
            return False
        window = self.params.balance_window_s
        seen = decayed(self._preambles, view.preamble_key, now, window)
        if seen + 0.5 < self.params.shared_preamble_requests:  # a decayed count: round, don't truncate
            return False
        share = seen / max(seen, decayed(self._preambles, 0, now, window))
        wanted = math.ceil(len(cached) * share * self.params.preamble_spread - 1e-9)
        holders = sum(1 for n in cached if n >= view.preamble_tokens)
        return bool(holders < wanted)

    def _delays(
        self,
        view: RequestView,
        ids: list[str],
        cached: list[int],
        waits: list[float],
        per_token: list[float],
        prompt: int,
        recent: list[float],
        discount: float,
    ) -> list[float]:
        """What each candidate's prefill costs the requests that will queue behind it, in seconds.

        A prefill of x seconds at r delays by x every request that reaches r before r's queue
        drains: about rate(r) × (wait(r) + x) of them, at r's recent arrival rate. Negligible while
        queues are short (the predicted TTFT decides), it dominates near saturation, where a long
        prompt re-prefilled on a replica that lacks it is throughput lost, and throughput is what
        the tail is made of. The index forgets a preamble once it would have been evicted; the
        replica it was last sent to is still taken to keep `home_credit` of it, so that a re-prefill
        goes back there instead of copying it to a second replica (a group split over replicas
        evicts twice as much). The credit is for this cost only, never for the predicted TTFT. A
        preamble the spread rule wants on more replicas (`discount`) is not charged to a new holder."""
        p = self.params
        preamble = view.preamble_tokens
        expected = cached
        home = self._homes.get(view.preamble_key) if preamble and p.home_credit else None
        if home in ids and max(cached) < preamble:
            i = ids.index(home)
            expected = list(cached)
            expected[i] = max(cached[i], int(p.home_credit * preamble))
        elif discount:  # a preamble that wants more holders: copying it is the point, not a cost
            expected = [n + int(discount * (preamble - n)) if n < preamble else n for n in cached]
        weight, window = p.delay_weight, p.balance_window_s
        out = []
        for wait, n, s_per_token, work in zip(waits, expected, per_token, recent):
            x = s_per_token * (prompt - n if prompt > n else 0)
            out.append(weight * x * (wait + x) * work / window)
        return out

    def _recent_works(self, ids: list[str], now: float) -> list[float]:
        """Each replica's recent requests, decayed to `now`."""
        return decayed_each(self._recent, ids, now, self.params.balance_window_s)

    def _conversational(self, now: float) -> bool:
        """Do most recent requests continue a conversation? Then placing a new one places its future
        turns too; for single requests (a hot system prompt, prefix groups) the load decides alone."""
        window = self.params.balance_window_s
        continuing = decay(self._continuing, now, window)
        return bool(continuing > self.params.conversation_share * decayed(self._preambles, 0, now, window))

    def on_dispatched(self, view: RequestView, decision: Decision) -> None:
        replica_id = decision.replica_id
        now = self.cost.clock()
        window = self.params.balance_window_s
        self._recent[replica_id] = (decayed(self._recent, replica_id, now, window) + 1.0, now)
        # 0 counts every request: the denominator of shares
        for key in (0, view.preamble_key) if view.preamble_key else (0,):
            seen = decayed(self._preambles, key, now, window) + 1.0
            self._preambles.pop(key, None)
            if len(self._preambles) >= MAX_TRACKED:
                del self._preambles[next(k for k in self._preambles if k)]
            self._preambles[key] = (seen, now)
        if view.preamble_key:
            put_newest(self._homes, view.preamble_key, replica_id, MAX_TRACKED)
        self._ended(view.request_id)  # a retry: its earlier attempt is over
        prompt_tokens = decision.plan[0] if decision.plan is not None else view.prompt_tokens_estimate
        entry = (replica_id, view.preamble_key, prompt_tokens)
        evicted = put_newest(self._in_flight, view.request_id, entry, MAX_TRACKED)
        self.cost.started(*entry)
        if evicted is not None:  # one that never reported its end: stop counting it
            self.cost.ended(*evicted[1])
        if decision.plan is None:  # a decision this policy did not make: counted, nothing queued
            return
        prompt, ids, cached, loads, has_home = decision.plan
        if has_home:
            self._continuing = (decay(self._continuing, now, window) + 1.0, now)
        if self._between is not None:
            self._between.dispatched(view.request_id, replica_id, has_home, has_home or self._conversational(now), now)
        if replica_id in ids:
            last = len(ids) - 1 - ids[::-1].index(replica_id)  # a repeated id: its last row, as a dict would
            self._unqueued.pop(view.request_id, None)
            if not loads[last] or self.cost.queue_empty(replica_id):
                put_newest(
                    self._unqueued, view.request_id, (replica_id, loads[last], self.cost.load_scale), MAX_TRACKED
                )
            done_at, prefill_s = self.cost.dispatched(replica_id, prompt - cached[last])
            put_newest(self._done_at, view.request_id, (replica_id, done_at, prefill_s), MAX_TRACKED)

    def _ended(self, request_id: str) -> None:
        entry = self._in_flight.pop(request_id, None)
        if entry is not None:
            self.cost.ended(*entry)
        if self._between is not None:  # an attempt that never answered: no turn of it ended
            self._between.forget(request_id)

    def on_failed(self, view: RequestView, replica_id: str) -> None:
        """It never ran there: its prefill leaves that replica's virtual queue, its context the batch."""
        self._ended(view.request_id)
        if self._unqueued.get(view.request_id, ("",))[0] == replica_id:
            del self._unqueued[view.request_id]
        dispatched = self._done_at.get(view.request_id)
        if dispatched is not None and dispatched[0] == replica_id:
            del self._done_at[view.request_id]
            self.cost.cancelled(replica_id, dispatched[2])

    def on_first_token(self, view: RequestView, replica_id: str) -> None:
        """The prefill is over, and so is all queued before it: the virtual queue moves up now, not
        when the answer ends (a long answer would keep its prefill in the queue for its whole decode)."""
        dispatched = self._done_at.get(view.request_id)
        if dispatched is not None and dispatched[0] == replica_id:
            del self._done_at[view.request_id]
            self.cost.prefilled(replica_id, dispatched[1])

    def prefill_s_per_token(self, replica_id: str) -> float | None:
        return self.cost.prefill_s_per_token(replica_id)

    def on_removed(self, replica_id: str) -> None:
        self.cost.forget(replica_id)

    def on_finished(self, view: RequestView, replica_id: str, outcome: Outcome) -> None:
        self.on_first_token(view, replica_id)  # no first token came (failed, or not reported): over anyway
        if self._between is not None:
            self._between.ended(view.request_id, replica_id, outcome.ok, self.cost.clock())
        self._ended(view.request_id)
        unqueued = self._unqueued.get(view.request_id)
        if unqueued is None or unqueued[0] != replica_id:
            return  # it queued behind others (or this attempt is not the one dispatched last)
        del self._unqueued[view.request_id]
        if not outcome.ok or outcome.ttft_s is None or outcome.predicted is None:
            return
        prompt = outcome.prompt_tokens or view.prompt_tokens_estimate
        cached = outcome.cached_tokens if outcome.cached_tokens is not None else outcome.predicted.cached_tokens
        if unqueued[1]:
            self.cost.observe_loaded(replica_id, outcome.ttft_s, prompt - cached, outcome.predicted.wait_s, unqueued[2])
        else:
            self.cost.observe(replica_id, outcome.ttft_s, prompt - cached, outcome.predicted.wait_s)
