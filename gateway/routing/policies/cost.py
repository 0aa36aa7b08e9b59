"""Predicted time to first token, in seconds, and its online calibration.

    predicted_ttft(r) = wait(r) + base_s + prefill_s_per_token(r) × (prompt_tokens − cached_tokens(r))
    wait(r)           = queued_prefill_s(r)
                        + prefill_s_per_token × (per_request_tokens × load(r) + context_weight × context(r)
                                                 + burst_weight × per_request_tokens × own(r))

`queued_prefill_s` is the larger of two queues. A virtual queue of the uncached prefill this
gateway has sent to `r`: each dispatch pushes its drain time forward by its own prefill, and it
drains in real time and moves up when a request's first token shows its prefill done; it reacts
at dispatch, before any scrape, so a burst of identical requests sees the work the first ones
already queued. And the work of other clients (other gateways included) waiting there: the
scraped requests beyond this gateway's in-flight ones, at most the scraped `waiting` count,
costed at the mean prefill of recent requests. (Counting the whole scraped queue counted this
gateway's own requests twice, once as of a scrape up to an interval old: at saturation that
steered by stale numbers, 3% behind least_loaded's p90 on hot-prefix.)
`per_request_tokens` prices each running request's share of every batched step (decode
interference), and `context_weight` the part of it that grows with the request: a batched step reads
every running request's whole context, so `context(r)`, the prompt tokens of this gateway's requests
in flight at `r` (counted at dispatch, until they finish), slows the next first token in proportion.
It is known at dispatch, before any scrape: a burst of long prompts sent to one replica raises its
predicted wait with each one, so the next spills before the home queue builds, and comes back as they
finish. (A flat price per request undercharged a burst of 1,600-token prompts: the home replica was kept
until a cold miss elsewhere looked cheaper, about 15 requests in; tenant-bursts, docs/benchmarks/stress.md.)
`own(r)` counts the request's own group's requests in flight at `r` beyond the first, and `burst_weight`
prices them again: many of one tenant's requests at one replica are a burst's signature. It applies
whether or not the caches have room (the caller turns the context price off once they are full: a moved
prompt evicts another's), since a burst lengthens its home's every step either way; steady traffic of
many groups has about one request per group in flight and pays nothing for it. (Under cache pressure
the context price alone kept a tenant's burst at its home behind 30-40 of its own requests: bursts
under cache pressure, docs/benchmarks/stress.md.)

The prefill cost per token starts at the configured value and follows observed TTFTs (one
estimate for the pool, or one per replica; prefix_affinity feeds it only requests that found
their replica idle, whose TTFT is no queue). An engine's prefill step costs a fixed part (one
scheduler step, the model's layers, I/O) plus a part per token, and queued prefills share a step:
k of them cost one fixed part, not k. So the two are learned apart, as the line through recent
(uncached tokens, TTFT) pairs (`LineFit`), once their prompt sizes spread enough to fit one; until
then, requests that prefilled fewer than `min_learn_tokens` teach `base_s` and longer ones the
per-token cost. The virtual queue pays `base_s` once for a replica it finds idle, and only the
per-token part for each prefill queued behind. (Folding the fixed part into the per-token cost, as
an engine with no short prompts taught it, over-priced queues on CPU vLLM about 2x: seven queued
chat turns predicted 3.9 s, their first token came after 1.8 s.)

The price of the requests in flight (`per_request_tokens`, `context_weight`) is the simulator
engine's; an engine whose running requests slow a new prefill less teaches a lower one: the TTFT a
request added beyond its own prefill, where it found requests in flight and none of this gateway's
prefills queued ahead, over what their price predicted (vLLM's CPU build: about a third). It is
never raised above the configured price (where the simulator's engine taught more, new
conversations spread wider and agent-loop's TTFT p90 grew from 117 to 161 ms), and it applies only
once it has fallen below `LOAD_SCALE_APPLIES` of it: the simulator's engine, which the price was
tuned on, teaches 0.85-0.95, and taking that moved its saturated trace cell's tail by 20 %.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Final

from gateway.config.policy_params import CostModelConfig
from gateway.request.decision import Candidate

# The learned price of the requests in flight stays within these factors of the configured one (module doc).
LOAD_SCALE_MIN, LOAD_SCALE_MAX = 0.1, 1.0
LOAD_SCALE_APPLIES = 0.7  # a learned scale above this is taken as the configured price's noise


def learning_weight(samples: int, alpha: float) -> float:
    """The weight of the newest of `samples` observations: a running mean over the first 1/alpha, then an
    EWMA, so a default that is far off is corrected at once and later noise moves it only by alpha."""
    return max(alpha, 1 / samples)


class CostModel:
    """Per-replica prefill cost and virtual prefill queue. All methods are sync and O(1)."""

    # Observed per-token costs are clamped to this factor around the default, so one outlier
    # (a TTFT dominated by an unpredicted queue) cannot swing the estimate by orders of magnitude.
    CLAMP: Final = 50.0

    def __init__(self, params: CostModelConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.params = params
        self.clock = clock
        self._per_token: dict[str, float] = {}
        self._samples: dict[str, int] = {}
        self._fits: dict[str, LineFit] = {}
        self._base_s = 0.0  # TTFT of a request with nothing to prefill and no queue (one step, I/O)
        self._base_samples = 0
        self._drain_at: dict[str, float] = {}
        # This gateway's requests in flight, per (replica, group): (their prompt tokens, how many). A group is
        # what the caller keys a burst by (prefix_affinity: the preamble, one tenant's prompts).
        self._groups: dict[tuple[str, int], tuple[int, int]] = {}
        self._mean_prefill_s = params.prefill_s_per_token * params.min_learn_tokens
        self.load_scale = 1.0  # what the requests in flight are priced at, over their configured price
        self._load_learned = 1.0  # what they were seen to cost, over it
        self._load_samples = 0

    def prefill_s_per_token(self, replica_id: str) -> float:
        return self._per_token.get(self._key(replica_id), self.params.prefill_s_per_token)

    def _key(self, replica_id: str) -> str:
        # Alike replicas share one estimate: four times the samples, and no replica attracts
        # traffic just because noise made its estimate look faster.
        return replica_id if self.params.calibrate == "replica" else ""

    def predict_many(
        self,
        candidates: Sequence[Candidate],
        loads: Sequence[float],
        prompt_tokens: int,
        now: float,
        group: int | None = None,
        burst_group: int = 0,
    ) -> tuple[list[float], list[float], list[float]]:
        """(wait_s, predicted_ttft_s, prefill_s_per_token) of sending a `prompt_tokens` prompt to each
        candidate (`loads[i]` is `candidates[i].load`). What is the same for every candidate is looked up once.
        `group` prices its context in flight, `burst_group` its requests in flight (0: none, as a preamble key)."""
        params = self.params
        default, scale = params.prefill_s_per_token, self.load_scale
        per_request_tokens = params.per_request_tokens * scale
        mean_prefill_s, base_s, drain_at = self._mean_prefill_s, self._base_s, self._drain_at
        context_weight = params.context_weight * scale if group is not None else 0.0
        burst = params.burst_weight * params.per_request_tokens * scale if burst_group else 0.0
        groups, none = self._groups, (0, 0)
        if params.calibrate == "replica":
            get = self._per_token.get
            per_token = [get(c.replica_id, default) for c in candidates]
        else:
            per_token = [self._per_token.get("", default)] * len(candidates)
        waits: list[float] = []
        ttfts: list[float] = []
        for c, load, s_per_token in zip(candidates, loads, per_token):
            # The same arithmetic as max(own, scraped) + per_request_s × load, spelled out (no calls).
            drain = drain_at.get(c.replica_id)
            own = drain - now if drain is not None else 0.0
            if not own > 0.0:
                own = 0.0
            foreign = c.running + c.waiting - c.in_flight  # not ours, as of the scrape...
            if foreign > c.waiting:
                foreign = c.waiting  # ...and still waiting for their prefill
            scraped = foreign * mean_prefill_s if foreign > 0 else 0.0
            wait = (scraped if scraped > own else own) + per_request_tokens * s_per_token * load
            if context_weight and group is not None:
                wait += context_weight * s_per_token * groups.get((c.replica_id, group), none)[0] / c.weight
            if burst:
                behind = groups.get((c.replica_id, burst_group), none)[1] - 1  # the group's own beyond the first
                if behind > 0:
                    wait += burst * s_per_token * behind / c.weight
            uncached = prompt_tokens - c.cached_tokens
            if uncached < 0:
                uncached = 0
            waits.append(wait)
            ttfts.append(wait + base_s + s_per_token * uncached)
        return waits, ttfts, per_token

    def dispatched(self, replica_id: str, uncached_tokens: int) -> tuple[float, float]:
        """Queue the request's prefill; returns when it is expected to be done, and its prefill_s (what
        leaves the queue if it never runs). An idle replica starts a step for it (`base_s`); a prefill
        queued behind others joins their step."""
        now = self.clock()
        prefill_s = self.prefill_s_per_token(replica_id) * uncached_tokens
        drain = self._drain_at.get(replica_id, now)
        start = drain if drain > now else now + self._base_s
        done_at = self._drain_at[replica_id] = start + prefill_s
        self._mean_prefill_s += 0.05 * (prefill_s - self._mean_prefill_s)
        return done_at, prefill_s

    def started(self, replica_id: str, group: int, prompt_tokens: int) -> None:
        """A request of `prompt_tokens` is in flight at the replica: its context joins every step there."""
        key = (replica_id, group)
        tokens, requests = self._groups.get(key, (0, 0))
        self._groups[key] = (tokens + prompt_tokens, requests + 1)

    def ended(self, replica_id: str, group: int, prompt_tokens: int) -> None:
        """...and is no longer (finished, failed, or forgotten)."""
        key = (replica_id, group)
        tokens, requests = self._groups.get(key, (0, 0))
        if requests > 1:
            self._groups[key] = (max(0, tokens - prompt_tokens), requests - 1)
        else:
            self._groups.pop(key, None)

    def queue_empty(self, replica_id: str) -> bool:
        """No prefill this gateway sent is queued at the replica now."""
        drain = self._drain_at.get(replica_id)
        return drain is None or drain <= self.clock()

    def cancelled(self, replica_id: str, prefill_s: float) -> None:
        """A queued prefill of `prefill_s` will never run there (its attempt failed)."""
        drain = self._drain_at.get(replica_id)
        if drain is not None:
            self._drain_at[replica_id] = max(self.clock(), drain - prefill_s)

    def prefilled(self, replica_id: str, done_at: float) -> None:
        """A request expected done with its prefill at `done_at` has its first token: its prefill, and
        all queued before it, are over, so whatever the queue still counted for them is removed
        (everything behind moves up)."""
        now = self.clock()
        early = done_at - now
        if early > 0 and replica_id in self._drain_at:
            self._drain_at[replica_id] = max(now, self._drain_at[replica_id] - early)

    def observe(self, replica_id: str, ttft_s: float, uncached_tokens: int, predicted_wait_s: float) -> None:
        """Fold one observed TTFT in: the fixed part and the per-token cost of a prefill.

        Each estimate is a running mean over its first 1/learn_alpha samples, then an EWMA, so a
        default that is far off (other hardware, a sped-up simulator) is corrected at once."""
        alpha = self.params.learn_alpha
        if alpha == 0:
            return
        residual = max(0.0, ttft_s - predicted_wait_s)
        key = self._key(replica_id)
        default = self.params.prefill_s_per_token
        fit = self._fits.get(key)
        if fit is None:
            fit = self._fits[key] = LineFit()
        fit.add(uncached_tokens, residual, alpha)
        line = fit.line(default / self.CLAMP, default * self.CLAMP)
        if line is not None:
            self._base_s, self._per_token[key] = line
            return
        if uncached_tokens < self.params.min_learn_tokens:
            self._base_samples += 1
            self._base_s += learning_weight(self._base_samples, alpha) * (residual - self._base_s)
            return
        sample = max(0.0, residual - self._base_s) / uncached_tokens
        sample = min(max(sample, default / self.CLAMP), default * self.CLAMP)
        n = self._samples[key] = self._samples.get(key, 0) + 1
        current = self.prefill_s_per_token(replica_id)
        self._per_token[key] = current + learning_weight(n, alpha) * (sample - current)

    def observe_loaded(
        self, replica_id: str, ttft_s: float, uncached_tokens: int, predicted_wait_s: float, scale: float
    ) -> None:
        """Fold in a request that found requests in flight at its replica and none of this gateway's prefills
        queued ahead: its predicted wait was their price alone (times `scale`, the load scale applied then), and
        what its TTFT added beyond its own prefill is what they cost."""
        alpha = self.params.learn_alpha
        priced = predicted_wait_s / scale
        if alpha == 0 or priced <= 0:
            return
        added = ttft_s - self._base_s - self.prefill_s_per_token(replica_id) * uncached_tokens
        sample = min(max(added / priced, LOAD_SCALE_MIN), LOAD_SCALE_MAX)
        self._load_samples += 1
        self._load_learned += learning_weight(self._load_samples, alpha) * (sample - self._load_learned)
        self.load_scale = self._load_learned if self._load_learned < LOAD_SCALE_APPLIES else 1.0

    def forget(self, replica_id: str) -> None:
        if self.params.calibrate == "replica":
            self._per_token.pop(replica_id, None)
            self._samples.pop(replica_id, None)
            self._fits.pop(replica_id, None)
        self._drain_at.pop(replica_id, None)
        for key in [key for key in self._groups if key[0] == replica_id]:
            del self._groups[key]


class LineFit:
    """TTFT residual ≈ base + slope × uncached tokens, by least squares over recent idle requests: the
    running means of the first 1/alpha samples, then EWMAs (the same weights as the other estimates)."""

    MIN_SAMPLES: Final = 8
    # The prompt sizes must spread: a standard deviation of at least this share of their mean, or the
    # slope is noise (every sample one size tells the sum of the two parts, not each).
    MIN_SPREAD: Final = 0.25

    def __init__(self) -> None:
        self.samples = 0
        self.mean_x = self.mean_y = self.var_x = self.cov_xy = 0.0

    def add(self, x: float, y: float, alpha: float) -> None:
        self.samples += 1
        weight = learning_weight(self.samples, alpha)
        dx, dy = x - self.mean_x, y - self.mean_y
        self.mean_x += weight * dx
        self.mean_y += weight * dy
        self.var_x = (1 - weight) * (self.var_x + weight * dx * dx)
        self.cov_xy = (1 - weight) * (self.cov_xy + weight * dx * dy)

    def line(self, min_slope: float, max_slope: float) -> tuple[float, float] | None:
        """(base, slope) once the samples can tell them apart; the slope within its bounds and at most
        the mean cost per token, so that the base is never negative."""
        if self.samples < self.MIN_SAMPLES or self.var_x <= 0 or self.var_x < (self.MIN_SPREAD * self.mean_x) ** 2:
            return None
        slope = min(max(self.cov_xy / self.var_x, min_slope), max_slope, self.mean_y / self.mean_x)
        return max(0.0, self.mean_y - slope * self.mean_x), slope
