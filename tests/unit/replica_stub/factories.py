"""Factories for replica_stub unit tests: a scheduler over a small pool and requests, no engine."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from replica_stub.block_pool import BlockPool
from replica_stub.kv_cache import KVCacheManager
from replica_stub.request import Request, SamplingParams
from replica_stub.scheduler import Batching, RequestOutput, Scheduler

EOS = 999_999
_ids = itertools.count()


def make_scheduler(
    *,
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 4,
    max_num_batched_tokens: int = 256,
    max_model_len: int = 128,
    batching: Batching = "continuous",
) -> Scheduler:
    kv = KVCacheManager(BlockPool(num_blocks, block_size))
    return Scheduler(
        kv,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        batching=batching,
    )


def make_request(
    tokens: Sequence[int] | int = 10,
    *,
    block_size: int = 4,
    max_tokens: int = 4,
    ignore_eos: bool = False,
    request_id: str | None = None,
) -> Request:
    """`tokens` is the prompt, or a length for a prompt of distinct ids unique to this request."""
    n = next(_ids)
    prompt = list(tokens) if not isinstance(tokens, int) else [n * 10_000 + i for i in range(tokens)]
    return Request(
        request_id or f"req-{n}",
        prompt,
        SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos),
        block_size,
        eos_token_id=EOS,
    )


def run_step(scheduler: Scheduler, token: int = 7) -> list[RequestOutput]:
    """One schedule/update round where every sampling request samples `token`."""
    out = scheduler.schedule()
    sampled = {s.request.request_id: token for s in out.scheduled if s.samples}
    return scheduler.update_from_output(out, sampled)
