"""The lab's engine-aware oracle: route each request where its true predicted TTFT is lowest.

Not a product policy (no gateway can see this much): in `affinity-gateway simulate --policies oracle` the
simulation hands it each replica's true state — the scheduler's waiting line and running batch, the block
pool's cached blocks, the step in flight — and the sim engine's own step cost (`TimingModel`). For each
candidate it replays the continuous-batching scheduler forward, step by step, until the new request's
prefill would be done: decode rows of the running batch in every step (their contexts grow, they leave
when their answers end), queued prefills first-come first-served under the per-step token budget, each
queued request hitting what the pool holds or what a request ahead of it will have computed by then.

It is a yardstick: how far prefix_affinity, which sees only what a gateway sees, is from the best a greedy
router could do with perfect knowledge, family by family. What it leaves out: KV-cache pressure
(preemption, eviction during the wait) and the requests that will arrive after this one.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from gateway.config.schema import Section
from gateway.request.decision import Candidate, Decision, Score
from gateway.routing.policies.base import Policy
from gateway.view import RequestView
from lab.sim_state import SimReplica
from replica_stub.engine.simulated import SimEngine
from replica_stub.engine.timing import TimingModel
from replica_stub.request import chain_hashes

MAX_STEPS = 100_000  # a replay this long means a queue no router would choose; stop and call it that long


class OracleConfig(Section):
    """No parameters: the oracle is the engine's own arithmetic (a config model like every policy's
    parameters, for the run's record)."""

    seed: int = 0


class EngineState(Protocol):
    """What the oracle reads: the simulation (`lab.simulate.Simulation`) provides it."""

    @property
    def replicas(self) -> Mapping[str, SimReplica]: ...

    @property
    def engine(self) -> SimEngine: ...

    @property
    def routing_prompt(self) -> list[int]: ...

    def clock(self) -> float: ...


class OraclePolicy(Policy):
    type = "oracle"

    def __init__(self, params: OracleConfig | None = None) -> None:
        super().__init__(params or OracleConfig())
        self._state: EngineState | None = None

    def bind(self, state: EngineState) -> None:
        self._state = state

    def choose(self, view: RequestView, candidates: Sequence[Candidate]) -> Decision:
        state = self._state
        if state is None:
            raise RuntimeError("the oracle routes only inside the simulator (Simulation binds it)")
        prompt, engine, now = state.routing_prompt, state.engine, state.clock()
        ttfts = []
        for c in candidates:
            replica = state.replicas[c.replica_id]
            ttfts.append(predicted_ttft_s(replica, prompt, now, engine.timing, engine.speedup))
        best = min(ttfts)
        # Ties (idle replicas that hold the same prefix): the one with the fewest requests in flight.
        pick = min((i for i, t in enumerate(ttfts) if t <= best + 1e-9), key=lambda i: candidates[i].in_flight)
        scores = tuple(Score(c.replica_id, t, load=c.load) for c, t in zip(candidates, ttfts))
        return Decision(candidates[pick].replica_id, "oracle", scores)


def predicted_ttft_s(replica: SimReplica, prompt: list[int], now: float, timing: TimingModel, speedup: float) -> float:
    """Seconds from `now` until a new request with `prompt` (stub tokens) sent to `replica` has its first
    token, replaying the replica's scheduler and the engine's step cost forward."""
    scheduler = replica.scheduler
    pool, budget_limit = scheduler.kv.pool, scheduler.max_num_batched_tokens
    block = pool.block_size
    at = max(now, replica.busy_until) if replica.busy else now
    in_step = {s.request.request_id: s.num_new_tokens for s in replica.step.scheduled} if replica.step else {}
    run = replica.run
    ahead_steps = len(run.times) if run is not None else 0  # the run's steps done, plus the one in flight
    in_run = {r.request_id for r in run.requests} if run is not None else set()
    ahead: set[int] = set()  # blocks the requests ahead will have computed by the time ours is admitted
    decoders: list[tuple[int, int]] = []  # (context now, decode steps left)
    queue: list[list[int]] = []  # [prefill tokens left, tokens computed, decode steps after it]
    for r in scheduler.running:
        computed, outputs = r.num_computed_tokens, len(r.output_token_ids)
        if r.request_id in in_step:
            computed += in_step[r.request_id]
            outputs += computed >= r.num_tokens  # that step sampled a token
        if r.request_id in in_run:
            computed, outputs = computed + ahead_steps, outputs + ahead_steps
        left = r.sampling.max_tokens - outputs
        if computed >= r.num_prompt_tokens and left > 0:
            decoders.append((computed, left))
        elif computed < r.num_prompt_tokens:
            queue.append([r.num_tokens - computed, computed, r.sampling.max_tokens - outputs - 1])
        ahead.update(r.block_hashes)
    for r in scheduler.waiting:
        hit = _cached_tokens(r.block_hashes, r.num_tokens, block, pool.get_cached_block, ahead)
        queue.append([r.num_tokens - hit, hit, r.sampling.max_tokens - len(r.output_token_ids) - 1])
        ahead.update(r.block_hashes)
    hit = _cached_tokens(chain_hashes(prompt, block), len(prompt), block, pool.get_cached_block, ahead)
    queue.append([len(prompt) - hit, hit, -1])  # ours: -1 marks it
    return _replay(at, decoders, queue, budget_limit, timing, speedup) - now


def _cached_tokens(
    hashes: list[int], tokens: int, block: int, cached: Callable[[int], object | None], ahead: set[int]
) -> int:
    """The longest prefix of full blocks the pool holds or a request ahead computes (the last token is
    always recomputed, as `KVCacheManager.get_computed_blocks` does)."""
    n = 0
    for block_hash in hashes[: (tokens - 1) // block]:
        if block_hash not in ahead and cached(block_hash) is None:
            break
        n += 1
    return n * block


def _replay(
    at: float, decoders: list[tuple[int, int]], queue: list[list[int]], limit: int, t: TimingModel, speedup: float
) -> float:
    """Step the batch forward from `at` until the request marked -1 in `queue` has prefilled; returns when."""
    step = 0
    ends: list[tuple[int, int]] = []  # (the step after which a decoder leaves, its context then)
    rows, contexts = 0, 0  # decoding rows and the sum of their contexts in the next step
    for context, left in decoders:
        rows, contexts = rows + 1, contexts + context
        heapq.heappush(ends, (left - 1, context + left))
    while step < MAX_STEPS:
        budget, prefill_ms, chunks = limit - rows, 0.0, 0
        for item in queue:
            if budget <= 0:
                break
            take = min(item[0], budget)
            prefill_ms += t.prefill_token_ms * take + t.prefill_attention_ms * take * (item[1] + take / 2) / 1000
            item[0], item[1], budget, chunks = item[0] - take, item[1] + take, budget - take, chunks + 1
        decode_ms = rows * t.decode_seq_ms + t.decode_context_ms * contexts / 1000
        base = t.prefill_base_ms if chunks else t.decode_base_ms - (t.decode_seq_ms if rows else 0.0)
        at += (base + prefill_ms + decode_ms) / 1000 / speedup
        contexts += rows
        while ends and ends[0][0] <= step:
            _, context = heapq.heappop(ends)
            rows, contexts = rows - 1, contexts - context
        while queue and queue[0][0] == 0:
            _, computed, left = queue.pop(0)
            if left == -1:
                return at
            if left > 0:  # its first token came with the prefill; it decodes from the next step
                rows, contexts = rows + 1, contexts + computed
                heapq.heappush(ends, (step + left, computed + left))
        step += 1
    return at
