"""The sim engine's forecast of a new request's time to first token, from the replica's true state.

A replica that knows its own scheduler and step cost can say when a prompt sent to it now would have its
first token: replay the continuous-batching scheduler forward, step by step, until that prompt's prefill
is done. Decode rows of the running batch run in every step (their contexts grow, they leave when their
answers end at `max_tokens`); queued prefills go first-come first-served under the per-step token budget,
each hitting what the pool holds or what a request ahead of it will have computed by then.

No gateway can see this much. It is the yardstick of the lab's engine-aware oracle: inside the simulator
(`lab.oracle`) and, through the sim stub's `POST /debug/forecast_ttft`, in front of live stubs
(`lab.oracle_router`). What it leaves out: KV-cache pressure (preemption, eviction during the wait) and the
requests that arrive after this one.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Sequence

from replica_stub.engine.timing import TimingModel
from replica_stub.scheduler import Scheduler, SchedulerOutput

MAX_STEPS = 100_000  # a replay this long means a queue no router would choose; stop and call it that long


def predicted_ttft_s(
    scheduler: Scheduler,
    prompt_hashes: Sequence[int],
    prompt_tokens: int,
    now: float,
    timing: TimingModel,
    speedup: float,
    *,
    busy_until: float | None = None,
    step: SchedulerOutput | None = None,
    run_ids: Collection[str] = (),
    run_steps: int = 0,
) -> float:
    """Seconds from `now` until a new request of `prompt_tokens` tokens, whose full blocks hash to
    `prompt_hashes`, would have its first token on this scheduler.

    `busy_until`: when the step in flight ends (None: the engine is idle); `step`: that step, scheduled but
    not yet applied to the scheduler; `run_ids` and `run_steps`: requests of a fast-forwarded decode run (the
    simulator's) and the steps it has done, plus the one in flight, not yet applied either."""
    pool, budget_limit = scheduler.kv.pool, scheduler.max_num_batched_tokens
    block = pool.block_size
    at = now if busy_until is None else max(now, busy_until)
    in_step = {s.request.request_id: s.num_new_tokens for s in step.scheduled} if step is not None else {}
    ahead: set[int] = set()  # blocks the requests ahead will have computed by the time ours is admitted
    decoders: list[tuple[int, int]] = []  # (context now, decode steps left)
    queue: list[list[int]] = []  # [prefill tokens left, tokens computed, decode steps after it]
    for r in scheduler.running:
        computed, outputs = r.num_computed_tokens, len(r.output_token_ids)
        if r.request_id in in_step:
            computed += in_step[r.request_id]
            outputs += computed >= r.num_tokens  # that step sampled a token
        if r.request_id in run_ids:
            computed, outputs = computed + run_steps, outputs + run_steps
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
    hit = _cached_tokens(prompt_hashes, prompt_tokens, block, pool.get_cached_block, ahead)
    queue.append([prompt_tokens - hit, hit, -1])  # ours: -1 marks it
    return _replay(at, decoders, queue, budget_limit, timing, speedup) - now


def cached_prompt_tokens(scheduler: Scheduler, prompt_hashes: Sequence[int], prompt_tokens: int) -> int:
    """The prompt's tokens the pool holds now (full blocks, the last token always recomputed)."""
    pool = scheduler.kv.pool
    return _cached_tokens(prompt_hashes, prompt_tokens, pool.block_size, pool.get_cached_block, set())


def _cached_tokens(
    hashes: Sequence[int], tokens: int, block: int, cached: Callable[[int], object | None], ahead: set[int]
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
