"""Continuous batching as a synchronous state machine (vLLM v1 style).

`schedule()` decides what the next engine step computes; `update_from_output()` applies the
sampled tokens and reports new tokens and finished requests. There is no separate prefill or
decode phase: each scheduled request computes `num_tokens - num_computed_tokens` tokens (its
uncached prompt when admitted, then one token per step) under a per-step token budget, so a
long prompt is prefilled in chunks. Running requests go first; waiting ones are admitted
FCFS while a sequence slot and KV blocks are free. If a running request cannot get a block,
the most recently admitted one is preempted (blocks released, recomputed later, usually
from the prefix cache).

`batching="static"` is the older policy, kept to make its cost visible: once the previous batch
has finished, the first `max_num_seqs` waiting requests become the batch, and no other request
is admitted until every one of them has finished, so a short request waits for the batch's
longest answer (head-of-line blocking). `_joins_batch` is the one place the policies differ.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Literal

from replica_stub.kv_cache import KVCacheManager
from replica_stub.request import Request, RequestStatus

Batching = Literal["continuous", "static"]
BATCHING: tuple[Batching, ...] = ("continuous", "static")


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step. The engine reads `request` but never mutates it (read-only by
    contract, not frozen: one is built per running request per step, and frozen init costs 5x)."""

    request: Request
    num_new_tokens: int
    block_ids: list[int]

    @property
    def num_computed_tokens(self) -> int:
        return self.request.num_computed_tokens

    @property
    def samples(self) -> bool:
        """This step completes the request's known tokens, so a new token is sampled."""
        return self.request.num_computed_tokens + self.num_new_tokens == self.request.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    finished_request_ids: set[str] = field(default_factory=set)  # since the previous step


@dataclass(slots=True)
class RequestOutput:  # read-only by contract (one per generated token: not frozen, see ScheduledRequest)
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | None


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        batching: Batching = "continuous",
    ) -> None:
        self.kv = kv
        self.batching = batching
        self.batch: set[str] = set()  # static batching: the current batch's unfinished request ids
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self._finished_ids: set[str] = set()

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id}")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> None:
        """Abort (client gone) or stop (stop string) requests wherever they are; frees their blocks."""
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None or request.is_finished:
                continue
            if request.status is RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            self._finish(request, status)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_request_ids=self._finished_ids)
        self._finished_ids = set()
        budget = self.max_num_batched_tokens
        preemptions_before = self.num_preemptions
        index = 0
        running, scheduled, kv = self.running, out.scheduled, self.kv
        while index < len(running) and budget > 0:
            request = running[index]
            num_new = min(len(request.all_token_ids) - request.num_computed_tokens, budget)
            if not self._allocate_or_preempt(request, num_new):
                continue  # `request` itself was preempted; running shrank
            scheduled.append(ScheduledRequest(request, num_new, kv.block_ids(request)))
            budget -= num_new
            index += 1
        if index < len(self.running) or self.num_preemptions > preemptions_before:
            return out  # under pressure: admit nothing new this step
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            request = self.waiting[0]
            if not self._joins_batch(request):
                break
            hits, num_cached = self.kv.get_computed_blocks(request)
            num_new = min(request.num_tokens - num_cached, budget)
            if not self.kv.allocate_slots(request, num_new, hits):
                break
            self.waiting.popleft()
            request.num_computed_tokens = num_cached
            request.status = RequestStatus.RUNNING
            if request.num_cached_tokens is None:
                request.num_cached_tokens = num_cached
                out.admitted.append(request)
            self.running.append(request)
            out.scheduled.append(ScheduledRequest(request, num_new, self.kv.block_ids(request)))
            budget -= num_new
        return out

    def _joins_batch(self, request: Request) -> bool:
        """May `request`, first in line, be admitted now? Continuous: always. Static: only as a member
        of the current batch, which is formed from the waiting line once the previous one has finished.
        Members are always first in line (new arrivals queue behind them, a preempted one goes back
        to the front), so stopping at the first non-member admits no one out of order."""
        if self.batching == "continuous":
            return True
        if not self.batch:
            self.batch = {r.request_id for r in islice(self.waiting, self.max_num_seqs)}
        return request.request_id in self.batch

    def decode_only_steps(self) -> int:
        """How many of the next steps are plain decode steps that change nothing but each running
        request's own tokens: nothing waiting, every running request one sampled token ahead of its
        computed ones (past its prompt, `ignore_eos`), no KV block to allocate or register, none
        finishing. Each such `schedule()` would schedule every running request for one token and
        each `update_from_output` append one token and finish none; 0 if the next step is not one.
        The simulator fast-forwards these steps (`advance_decode`) without calling `schedule()`, so
        the ids finished before them are reported by the `schedule()` after them (it has no engine)."""
        running = self.running
        if self.waiting or not running or len(running) > self.max_num_batched_tokens:
            return 0
        steps = self.max_model_len
        for request in running:
            num_tokens, num_computed = len(request.all_token_ids), request.num_computed_tokens
            if (
                num_tokens - num_computed != 1
                or num_computed < len(request.prompt_token_ids)
                or not request.sampling.ignore_eos
                or request.status is not RequestStatus.RUNNING
            ):
                return 0
            steps = min(
                steps,
                self.kv.steady_tokens(request),
                request.sampling.max_tokens - len(request.output_token_ids) - 1,
                self.max_model_len - num_tokens - 1,
            )
            if steps <= 0:
                return 0
        return steps

    def advance_decode(self, request: Request, token_ids: Sequence[int]) -> None:
        """Apply `len(token_ids)` of the steps `decode_only_steps` vouched for to `request` at
        once: what `update_from_output` does for it in each (compute the token, append the next)."""
        for token_id in token_ids:
            request.num_computed_tokens += 1
            request.append_output_token(token_id)

    def _allocate_or_preempt(self, request: Request, num_new: int) -> bool:
        """Grow `request`, preempting the newest running requests until it fits. Running
        requests are visited in order, so the ones preempted here were not scheduled yet;
        False if `request` itself had to go."""
        while not self.kv.allocate_slots(request, num_new):
            victim = self.running.pop()
            self._preempt(victim)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def update_from_output(self, out: SchedulerOutput, sampled: Mapping[str, int]) -> list[RequestOutput]:
        """Advance each scheduled request; append its sampled token; finish on EOS or length."""
        outputs = []
        running_status = RequestStatus.RUNNING
        for item in out.scheduled:
            request = item.request
            if request.status is not running_status:  # (a finished request is never RUNNING)
                continue  # aborted (or preempted) while the step ran
            num_new = item.num_new_tokens
            samples = request.num_computed_tokens + num_new == len(request.all_token_ids)  # item.samples
            request.num_computed_tokens += num_new
            token_id = sampled.get(request.request_id)
            if not samples or token_id is None:
                continue
            request.append_output_token(token_id)
            status = self._stop_status(request, token_id)
            if status is not None:
                self.running.remove(request)
                self._finish(request, status)
            outputs.append(RequestOutput(request.request_id, [token_id], status.value if status is not None else None))
        return outputs

    def _stop_status(self, request: Request, token_id: int) -> RequestStatus | None:
        if token_id == request.eos_token_id and not request.sampling.ignore_eos:
            return RequestStatus.FINISHED_STOPPED
        if len(request.output_token_ids) >= request.sampling.max_tokens or request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _finish(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        self.kv.free(request)
        del self.requests[request.request_id]
        self.batch.discard(request.request_id)
        self._finished_ids.add(request.request_id)
