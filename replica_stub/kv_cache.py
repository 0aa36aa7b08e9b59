"""KVCacheManager: the scheduler's facade over the block pool.

The scheduler asks "how much of this request is cached?", "can it grow by n tokens?" and
"it is done"; block lists and hashing details stay in here (vLLM v1 `kv_cache_manager`).
"""

from __future__ import annotations

from collections.abc import Sequence

from replica_stub.block_pool import BlockPool, KVCacheBlock
from replica_stub.request import Request


class KVCacheManager:
    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self._blocks: dict[str, list[KVCacheBlock]] = {}
        self._block_ids: dict[str, list[int]] = {}
        self._num_cached: dict[str, int] = {}

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of full blocks. The last prompt token is always recomputed
        (its logits are needed), so a fully cached prompt hits on all but its last block."""
        max_blocks = (request.num_tokens - 1) // self.block_size
        blocks = []
        for block_hash in request.block_hashes[:max_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks, len(blocks) * self.block_size

    def allocate_slots(
        self, request: Request, num_new_tokens: int, new_computed_blocks: Sequence[KVCacheBlock] = ()
    ) -> bool:
        """Reserve blocks for `num_new_tokens` more tokens; False (and no change) if they don't fit."""
        if not new_computed_blocks:  # fast path: a running request growing inside the blocks it holds
            held = self._blocks.get(request.request_id)
            if held:
                total = request.num_computed_tokens + num_new_tokens
                if -(-total // self.block_size) <= len(held):
                    num_full = total // self.block_size
                    if num_full > self._num_cached.get(request.request_id, 0):
                        self._cache_full_blocks(request, held, num_full)
                    return True
        held = self._blocks.setdefault(request.request_id, [])
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        total = num_computed + num_new_tokens
        num_required = -(-total // self.block_size)
        num_new_blocks = max(0, num_required - len(held) - len(new_computed_blocks))
        num_evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_new_blocks > self.pool.num_free_blocks - num_evictable_hits:
            if not held:
                del self._blocks[request.request_id]
            return False
        self.pool.touch(new_computed_blocks)
        new_blocks = [*new_computed_blocks, *self.pool.get_new_blocks(num_new_blocks)]
        held.extend(new_blocks)
        self._block_ids.setdefault(request.request_id, []).extend(b.block_id for b in new_blocks)
        self._cache_full_blocks(request, held, total // self.block_size)
        return True

    def steady_tokens(self, request: Request) -> int:
        """How far (in tokens) `request` can grow from its computed tokens before `allocate_slots`
        must take a new block or register a newly full one: within it, growing changes nothing here."""
        held = self._blocks.get(request.request_id)
        if not held:
            return 0
        start = self._num_cached.get(request.request_id, 0)
        limit = min(len(held) * self.block_size, (start + 1) * self.block_size - 1)
        return max(0, limit - request.num_computed_tokens)

    def _cache_full_blocks(self, request: Request, held: list[KVCacheBlock], num_full: int) -> None:
        start = self._num_cached.get(request.request_id, 0)
        num_full = min(num_full, len(request.block_hashes))
        if num_full <= start:
            return
        parent = request.block_hashes[start - 1] if start else None  # None: a prompt's first block
        tokens = request.all_token_ids[start * self.block_size : num_full * self.block_size]
        self.pool.cache_full_blocks(
            held[start:num_full], request.block_hashes[start:num_full], parent, tokens, request.lora
        )
        self._num_cached[request.request_id] = num_full

    def free(self, request: Request) -> None:
        """Release a request's blocks; its tail blocks become the first eviction candidates."""
        held = self._blocks.pop(request.request_id, [])
        self._block_ids.pop(request.request_id, None)
        self._num_cached.pop(request.request_id, None)
        self.pool.free_blocks(reversed(held))

    def block_ids(self, request: Request) -> list[int]:
        """The request's block ids in order: a live list, read-only for callers (no copy per step)."""
        return self._block_ids.get(request.request_id, [])

    def usage(self) -> float:
        return self.pool.usage()
