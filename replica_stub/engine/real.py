"""The real engine: SmolLM2-135M-Instruct on the CPU behind the Engine protocol.

Per step it (1) decodes all running sequences that need one token in a single batched
forward (left-padded, with an attention mask), then (2) prefills the other scheduled requests
one by one in the scheduler's order. Before a request's first forward, its cached prefix is
gathered from the BlockStore at the block ids the scheduler handed over, so only the uncached
rest is computed; after every forward, the blocks that became full are copied into the store,
where later requests with the same prefix find them. The scheduler registers a block's hash
when it allocates it, so a request admitted later in the same step may hit blocks this very
step computes: decodes run first and prefills in order, and each gathers its prefix just
before its own forward, so such blocks are always stored before they are read.

The model runs in one dedicated worker thread (torch's thread count is per thread), so the
event loop keeps serving /health, /metrics and streams while a step computes.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from replica_stub.engine.base import Tokenizer
from replica_stub.engine.kv_store import BlockStore, KVShape, SeqKV, ViewCache
from replica_stub.engine.model import HFTokenizer, load_model
from replica_stub.engine.sampling import make_generator, sample
from replica_stub.request import SamplingParams
from replica_stub.scheduler import SchedulerOutput


@dataclass(frozen=True, slots=True)
class Work:
    """A snapshot of one ScheduledRequest, taken on the event loop before the step runs."""

    request_id: str
    token_ids: list[int]  # the tokens this step computes
    num_computed: int
    block_ids: list[int]
    samples: bool
    sampling: SamplingParams


def plan(step: SchedulerOutput) -> list[Work]:
    """Snapshot a step on the event loop thread, so the worker never reads live scheduler state."""
    work = []
    for s in step.scheduled:
        request, start = s.request, s.num_computed_tokens
        work.append(
            Work(
                request.request_id,
                request.all_token_ids[start : start + s.num_new_tokens],
                start,
                list(s.block_ids),
                s.samples,
                request.sampling,
            )
        )
    return work


@dataclass(slots=True)
class SeqState:
    kv: SeqKV
    generator: torch.Generator | None


class RealEngine:
    name = "real"

    def __init__(self, *, block_size: int, kv_cache_mb: float, threads: int, dtype: str = "bfloat16") -> None:
        self._executor = ThreadPoolExecutor(
            1, thread_name_prefix="model", initializer=torch.set_num_threads, initargs=(threads,)
        )
        torch.set_num_threads(threads)
        model, tokenizer = load_model(dtype)
        self.model: Any = model
        self.tokenizer: Tokenizer = HFTokenizer(tokenizer)
        self.shape = KVShape.of(model)
        self.block_size = block_size
        self.num_blocks = self.shape.num_blocks(kv_cache_mb, block_size)
        if self.num_blocks < 1:
            raise ValueError(f"kv_cache_mb {kv_cache_mb} holds no block of {block_size} tokens")
        self.max_position = int(model.config.max_position_embeddings)
        self.store = BlockStore(self.shape, self.num_blocks, block_size)
        self._seqs: dict[str, SeqState] = {}
        self._attn_implementation = ""

    async def execute(self, step: SchedulerOutput) -> dict[str, int]:
        for request_id in step.finished_request_ids:
            self._seqs.pop(request_id, None)
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.run, plan(step))

    def run(self, work: list[Work]) -> dict[str, int]:
        """One step, synchronously (in the worker thread; calibration calls it directly)."""
        with torch.inference_mode():
            sampled: dict[str, int] = {}
            decodes = [
                (w, seq)
                for w in work
                if len(w.token_ids) == 1
                and (seq := self._seqs.get(w.request_id))
                and seq.kv.length == w.num_computed > 0
            ]
            if decodes:
                self._finish(
                    decodes, self._decode([s for _, s in decodes], [w.token_ids[0] for w, _ in decodes]), sampled
                )
            batched = {w.request_id for w, _ in decodes}
            for w in work:  # in order, so a prefix is gathered only after this step stored it
                if w.request_id not in batched:
                    seq = self._sequence(w)
                    self._finish([(w, seq)], self._prefill(seq, w.token_ids), sampled)
            return sampled

    def _sequence(self, w: Work) -> SeqState:
        """The request's working cache, (re)built from the block store when it is new, was
        preempted, or starts from a prefix-cache hit."""
        seq = self._seqs.get(w.request_id)
        if seq is not None and seq.kv.length == w.num_computed:
            return seq
        if w.num_computed % self.block_size:
            raise RuntimeError(f"{w.request_id}: cannot resume at token {w.num_computed} (not a block boundary)")
        kv = SeqKV(self.shape, max(256, w.num_computed + len(w.token_ids)))
        if w.num_computed:
            self.store.load(kv, w.block_ids[: w.num_computed // self.block_size])
        generator = seq.generator if seq is not None else make_generator(w.sampling)
        seq = self._seqs[w.request_id] = SeqState(kv, generator)
        return seq

    def _attention(self, implementation: str) -> None:
        """torch's CPU flash kernel (sdpa) wins for prefill (2,048 tokens: 5.2 s against eager's
        15.6 s) but loses for one-token decode steps (context 1,024: 87-98 ms against 61-72 ms)."""
        if self._attn_implementation != implementation:
            self.model.set_attn_implementation(implementation)
            self._attn_implementation = implementation

    def _prefill(self, seq: SeqState, token_ids: list[int]) -> torch.Tensor:
        self._attention("sdpa")
        return self._forward(seq, token_ids)

    def _forward(self, seq: SeqState, token_ids: list[int]) -> torch.Tensor:
        """Forward the new tokens of one sequence; logits of its last position [1, vocab]."""
        kv, n = seq.kv, len(token_ids)
        kv.reserve(kv.length + n)
        positions = torch.arange(kv.length, kv.length + n).unsqueeze(0)
        out = self.model(
            input_ids=torch.tensor([token_ids]),
            position_ids=positions,
            cache=kv.view_cache(),
            use_cache=True,
            logits_to_keep=1,
        )
        kv.length += n
        return out.logits[:, -1]

    def _decode(self, seqs: list[SeqState], token_ids: list[int]) -> torch.Tensor:
        """One token for each sequence in one forward; logits [batch, vocab]."""
        self._attention("eager")
        if len(seqs) == 1:
            return self._forward(seqs[0], token_ids)
        lengths = [s.kv.length for s in seqs]
        width = max(lengths)
        shape = self.shape
        size = (shape.num_layers, len(seqs), shape.num_kv_heads, width + 1, shape.head_dim)
        keys, values = torch.zeros(size, dtype=shape.dtype), torch.zeros(size, dtype=shape.dtype)
        mask = torch.zeros(len(seqs), width + 1, dtype=torch.long)
        for row, (seq, length) in enumerate(zip(seqs, lengths, strict=True)):
            keys[:, row, :, width - length : width] = seq.kv.keys[:, :, :length]
            values[:, row, :, width - length : width] = seq.kv.values[:, :, :length]
            mask[row, width - length :] = 1
        out = self.model(
            input_ids=torch.tensor(token_ids).unsqueeze(1),
            attention_mask=mask,
            position_ids=torch.tensor(lengths).unsqueeze(1),
            cache=ViewCache(keys, values, width),
            use_cache=True,
            logits_to_keep=1,
        )
        for row, (seq, length) in enumerate(zip(seqs, lengths, strict=True)):
            seq.kv.reserve(length + 1)
            seq.kv.keys[:, :, length] = keys[:, row, :, width]
            seq.kv.values[:, :, length] = values[:, row, :, width]
            seq.kv.length = length + 1
        return out.logits[:, -1]

    def _finish(self, items: list[tuple[Work, SeqState]], logits: torch.Tensor, sampled: dict[str, int]) -> None:
        """Store the blocks each forward filled, then sample for the requests that need a token."""
        for row, (w, seq) in enumerate(items):
            first, end = w.num_computed // self.block_size, seq.kv.length // self.block_size
            self.store.save(seq.kv, w.block_ids[first:end], first)
            if w.samples:
                sampled[w.request_id] = sample(logits[row], w.sampling, seq.generator)

    def release_all(self) -> None:
        """Drop every sequence's working cache (the block store keeps the cached prefixes)."""
        self._seqs.clear()

    async def close(self) -> None:
        self.release_all()
        self._executor.shutdown(wait=True, cancel_futures=True)
