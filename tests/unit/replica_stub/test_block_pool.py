from __future__ import annotations

import pytest

from replica_stub.block_pool import BlockPool, BlockRemoved, BlockStored, FreeKVCacheBlockQueue, KVCacheBlock, KVEvent
from replica_stub.request import ROOT_HASH, chain_hashes, hash_block_tokens


def test_free_queue_is_fifo_with_o1_middle_removal() -> None:
    blocks = [KVCacheBlock(i) for i in range(4)]
    queue = FreeKVCacheBlockQueue(blocks)
    queue.remove(blocks[2])
    assert queue.block_ids() == [0, 1, 3]
    assert queue.popleft() is blocks[0]
    queue.append(blocks[0])
    assert queue.block_ids() == [1, 3, 0] and queue.num_free_blocks == 3
    with pytest.raises(ValueError):
        queue.remove(blocks[2])


def test_new_blocks_come_from_the_head_and_are_pinned() -> None:
    pool = BlockPool(4, block_size=2)
    blocks = pool.get_new_blocks(3)
    assert [b.block_id for b in blocks] == [0, 1, 2]
    assert all(b.ref_cnt == 1 for b in blocks) and pool.num_free_blocks == 1
    assert pool.usage() == pytest.approx(0.75)
    with pytest.raises(ValueError):
        pool.get_new_blocks(2)


def test_freed_cached_blocks_stay_hittable_until_reused_lru() -> None:
    events: list[KVEvent] = []
    pool = BlockPool(3, block_size=2, on_event=events.append)
    a, b, c = pool.get_new_blocks(3)
    pool.cache_full_blocks([a, b, c], [11, 12, 13], None, [1, 2, 3, 4, 5, 6])
    pool.free_blocks([a, b, c])
    assert pool.get_cached_block(12) is b and pool.num_free_blocks == 3
    pool.touch([a])  # a hit moves `a` out of the free queue...
    pool.free_blocks([a])  # ...and freeing it again makes it the most recently used
    assert pool.free_queue.block_ids() == [b.block_id, c.block_id, a.block_id]
    (reused,) = pool.get_new_blocks(1)
    assert reused is b and pool.get_cached_block(12) is None and b.block_hash is None
    assert events == [BlockStored((11, 12, 13), None, (1, 2, 3, 4, 5, 6), 2), BlockRemoved((12,))]


def test_referenced_blocks_are_never_evicted() -> None:
    pool = BlockPool(2, block_size=2)
    held, spare = pool.get_new_blocks(2)
    pool.cache_full_blocks([held, spare], [1, 2], None, [0, 0, 0, 0])
    pool.touch([held])  # a second request shares it
    pool.free_blocks([held, spare])
    assert held.ref_cnt == 1 and pool.num_free_blocks == 1
    assert pool.get_new_blocks(1) == [spare]
    assert pool.get_cached_block(1) is held


def test_first_writer_wins_when_two_blocks_share_a_hash() -> None:
    events: list[KVEvent] = []
    pool = BlockPool(4, block_size=1, on_event=events.append)
    first, second, third, fourth = pool.get_new_blocks(4)
    pool.cache_full_blocks([first], [5], None, [9])
    pool.cache_full_blocks([second, third, fourth], [4, 5, 6], 3, [8, 9, 10])
    assert pool.get_cached_block(5) is first and third.block_hash is None
    assert events[1:] == [BlockStored((4,), 3, (8,), 1), BlockStored((6,), 5, (10,), 1)]


def test_chain_hash_names_the_whole_prefix() -> None:
    tokens = list(range(10))
    hashes = chain_hashes(tokens, 4)
    assert len(hashes) == 2  # only full blocks
    assert hashes[0] == hash_block_tokens(ROOT_HASH, tokens[:4])
    assert hashes[1] == hash_block_tokens(hashes[0], tokens[4:8])
    other = chain_hashes([99] + tokens[1:], 4)
    assert other[1] != hashes[1]  # same block tokens, different parent -> different hash
    assert chain_hashes(tokens[:8] + [42, 43], 4) == hashes


def test_chain_hashes_equal_block_by_block_hashing_with_any_tail() -> None:
    tokens = [(i * 7919) % 50_021 for i in range(70)]
    for length in (0, 3, 4, 5, 16, 69, 70):
        parent, expected = 11, []
        for start in range(0, length - 4 + 1, 4):
            parent = hash_block_tokens(parent, tokens[start : start + 4])
            expected.append(parent)
        assert chain_hashes(tokens[:length], 4, 11) == expected
