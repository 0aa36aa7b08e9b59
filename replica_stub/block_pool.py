"""The KV block pool: mechanism only. Which blocks exist, which hold a cached prefix, which
are free, and in what order free blocks are reused (LRU).

Mirrors vLLM v1's `BlockPool` + `FreeKVCacheBlockQueue`: a free block keeps its hash (so a
later request can still hit on it) until it is popped for reuse; that pop is the eviction.
All stores, evictions and resets call the `on_event` hook, so a KV-event publisher
(BlockStored/BlockRemoved/AllBlocksCleared) plugs in here without touching the scheduler.
A real engine indexes its KV tensors by `block_id`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from replica_stub.lora import Lora


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None
    prev_free: KVCacheBlock | None = None
    next_free: KVCacheBlock | None = None


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None  # the adapter whose blocks these are (vLLM's lora_id and lora_name)
    lora_name: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks through the blocks' own prev/next fields.

    O(1) popleft, append and removal from the middle (a cached free block that gets a hit),
    no allocation per operation. Head = evicted first. Freed blocks go to the tail, so the
    least recently used cached block is the next one to be evicted.
    """

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free, self._tail.prev_free = self._tail, self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        if block is None or block is self._tail:
            raise IndexError("no free blocks")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev.next_free, nxt.prev_free = nxt, prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self._tail.prev_free
        if last is None:
            raise RuntimeError("free queue sentinel broken")
        last.next_free, block.prev_free = block, last
        block.next_free, self._tail.prev_free = self._tail, block
        self.num_free_blocks += 1

    def block_ids(self) -> list[int]:
        """Free block ids in eviction order (for tests and debugging)."""
        ids, block = [], self._head.next_free
        while block is not None and block is not self._tail:
            ids.append(block.block_id)
            block = block.next_free
        return ids


class BlockPool:
    """Fixed pool of `num_blocks` blocks, a hash -> block map and the LRU free queue."""

    def __init__(self, num_blocks: int, block_size: int, on_event: Callable[[KVEvent], None] | None = None) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached: dict[int, KVCacheBlock] = {}
        self.on_event = on_event

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    def usage(self) -> float:
        """Fraction of blocks held by requests (vLLM's kv_cache_usage_perc; cached free blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_cached_block(self, block_hash: int) -> KVCacheBlock | None:
        return self.cached.get(block_hash)

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """Take `n` blocks from the head of the free queue, evicting whatever prefix they held."""
        if n > self.num_free_blocks:
            raise ValueError(f"asked for {n} blocks, {self.num_free_blocks} free")
        blocks = []
        for _ in range(n):
            block = self.free_queue.popleft()
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """A request starts using cached blocks: pin them (out of the free queue)."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered: Iterable[KVCacheBlock]) -> None:
        """Unpin; blocks reaching ref_cnt 0 join the tail in the given order (first = evicted first)."""
        for block in ordered:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def cache_full_blocks(
        self,
        blocks: Sequence[KVCacheBlock],
        block_hashes: Sequence[int],
        parent_hash: int | None,
        token_ids: Sequence[int],
        lora: Lora | None = None,
    ) -> None:
        """Register freshly filled blocks under their chain hashes (first writer wins on a race).
        Emits one BlockStored per contiguous run of newly stored blocks, naming `lora`'s adapter."""
        run: list[int] = []
        run_start = 0
        for index, (block, block_hash) in enumerate(zip(blocks, block_hashes, strict=True)):
            if block.block_hash is None and block_hash not in self.cached:
                block.block_hash = block_hash
                self.cached[block_hash] = block
                if not run:
                    run_start = index
                run.append(block_hash)
                continue
            self._stored(run, run_start, block_hashes, parent_hash, token_ids, lora)
            run = []
        self._stored(run, run_start, block_hashes, parent_hash, token_ids, lora)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, as vLLM's reset does: only when no block is in use (a
        running request's blocks must keep their hashes), else False and nothing changes."""
        if self.num_free_blocks != self.num_blocks:
            return False
        for block in self.cached.values():
            block.block_hash = None
        self.cached.clear()
        if self.on_event is not None:
            self.on_event(AllBlocksCleared())
        return True

    def _stored(
        self,
        run: list[int],
        start: int,
        block_hashes: Sequence[int],
        parent_hash: int | None,
        token_ids: Sequence[int],
        lora: Lora | None,
    ) -> None:
        if not run or self.on_event is None:
            return
        parent = block_hashes[start - 1] if start else parent_hash
        tokens = token_ids[start * self.block_size : (start + len(run)) * self.block_size]
        self.on_event(
            BlockStored(
                tuple(run),
                parent,
                tuple(tokens),
                self.block_size,
                *((lora.lora_id, lora.name) if lora is not None else ()),
            )
        )

    def _evict(self, block: KVCacheBlock) -> None:
        block_hash = block.block_hash
        if block_hash is None:
            return
        if self.cached.get(block_hash) is block:
            del self.cached[block_hash]
        block.block_hash = None
        if self.on_event is not None:
            self.on_event(BlockRemoved((block_hash,)))
