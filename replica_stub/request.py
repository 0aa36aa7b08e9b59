"""One generation request as the scheduler and the engine see it: token ids, progress, block
hashes (grown incrementally as blocks fill, so each block is hashed exactly once; a LoRA
adapter's chain starts from its own seed, so adapters never share blocks)."""

from __future__ import annotations

import enum
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import xxhash

from replica_stub.lora import Lora

ROOT_HASH = 0  # seed of the first block's hash


def hash_block_tokens(parent_hash: int, token_ids: Sequence[int]) -> int:
    """xxh3_64 of the block's token ids (uint64 little-endian), seeded with the parent's hash,
    so one hash names the whole prefix up to and including this block."""
    return xxhash.xxh3_64_intdigest(array("Q", token_ids).tobytes(), seed=parent_hash)


def chain_hashes(token_ids: Sequence[int], block_size: int, parent_hash: int = ROOT_HASH) -> list[int]:
    """Chain hashes of every full block of `token_ids` (one uint64 buffer, hashed block by block:
    the same bytes `hash_block_tokens` hashes)."""
    num_full = len(token_ids) // block_size
    data = memoryview(array("Q", token_ids[: num_full * block_size]).tobytes())
    step = block_size * 8
    hashes = []
    for start in range(0, num_full * step, step):
        parent_hash = xxhash.xxh3_64_intdigest(data[start : start + step], seed=parent_hash)
        hashes.append(parent_hash)
    return hashes


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self not in (RequestStatus.WAITING, RequestStatus.RUNNING)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    block_size: int
    eos_token_id: int | None = None
    lora: Lora | None = None  # the adapter the request names (None: the base model)
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(init=False)
    block_hashes: list[int] = field(init=False)
    num_computed_tokens: int = 0
    num_cached_tokens: int | None = None  # prefix-cache hit at first admission
    num_preemptions: int = 0
    hash_root: int = field(init=False)  # the first block's seed: the adapter's, else ROOT_HASH

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids)
        self.hash_root = ROOT_HASH if self.lora is None else self.lora.hash_root
        self.block_hashes = chain_hashes(self.all_token_ids, self.block_size, self.hash_root)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        all_token_ids = self.all_token_ids
        all_token_ids.append(token_id)
        if len(all_token_ids) % self.block_size == 0:
            parent = self.block_hashes[-1] if self.block_hashes else self.hash_root
            self.block_hashes.append(hash_block_tokens(parent, all_token_ids[-self.block_size :]))
