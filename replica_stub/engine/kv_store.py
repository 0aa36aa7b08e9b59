"""Real KV tensors: the block store the prefix cache points into, and each sequence's working cache.

`BlockStore` holds, for every block id of the replica's BlockPool, that block's keys and values
for every layer: one tensor each of shape [layers, num_blocks, kv_heads, block_size, head_dim],
so storing or gathering any number of blocks is a single indexed copy, not one per layer.
Which block ids hold which prefix (hashing, LRU, eviction) stays in BlockPool; the store only
keeps the bytes. A request that hits the cache gets its prefix gathered from here.

`SeqKV` is one running sequence's contiguous cache [layers, kv_heads, capacity, head_dim],
grown by doubling, so a decode step appends in place instead of re-concatenating the whole
history on every layer (which transformers' DynamicCache does).

`ViewCache` exposes such buffers to a transformers forward pass as a `Cache`: each layer
writes the new keys/values at `offset` and attends over the first `offset + n` positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer


@dataclass(frozen=True, slots=True)
class KVShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of(cls, model: Any) -> KVShape:
        config = model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_hidden_layers, config.num_key_value_heads, head_dim, model.dtype)

    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    def num_blocks(self, budget_mb: float, block_size: int) -> int:
        """How many blocks of `block_size` tokens fit in `budget_mb` MiB of KV memory."""
        return int(budget_mb * 2**20) // (self.bytes_per_token() * block_size)


class BlockStore:
    def __init__(self, shape: KVShape, num_blocks: int, block_size: int) -> None:
        size = (shape.num_layers, num_blocks, shape.num_kv_heads, block_size, shape.head_dim)
        self.shape, self.block_size = shape, block_size
        self.keys = torch.zeros(size, dtype=shape.dtype)
        self.values = torch.zeros(size, dtype=shape.dtype)

    def save(self, seq: SeqKV, block_ids: list[int], first_block: int) -> None:
        """Copy `seq`'s tokens of blocks first_block.. into the store slots `block_ids`."""
        if not block_ids:
            return
        start, n = first_block * self.block_size, len(block_ids)
        index = torch.tensor(block_ids)
        for store, buf in ((self.keys, seq.keys), (self.values, seq.values)):
            chunk = buf[:, :, start : start + n * self.block_size].unflatten(2, (n, self.block_size))
            store.index_copy_(1, index, chunk.transpose(1, 2))

    def load(self, seq: SeqKV, block_ids: list[int]) -> None:
        """Fill `seq` (empty) with the cached prefix held in `block_ids`, in order."""
        n = len(block_ids)
        seq.reserve(n * self.block_size)
        index = torch.tensor(block_ids)
        for store, buf in ((self.keys, seq.keys), (self.values, seq.values)):
            blocks = store.index_select(1, index)  # [layers, n, heads, block, dim]
            # One copy into the buffer through a view (a reshape first would copy twice: 2-4x slower).
            buf[:, :, : n * self.block_size].unflatten(2, (n, self.block_size)).copy_(blocks.transpose(1, 2))
        seq.length = n * self.block_size


class SeqKV:
    """One sequence's keys and values, [layers, kv_heads, capacity, head_dim] each."""

    def __init__(self, shape: KVShape, capacity: int = 256) -> None:
        size = (shape.num_layers, shape.num_kv_heads, capacity, shape.head_dim)
        self.keys = torch.empty(size, dtype=shape.dtype)
        self.values = torch.empty(size, dtype=shape.dtype)
        self.length = 0

    def reserve(self, total: int) -> None:
        """Make room for `total` tokens (doubling, so appends are amortized O(1))."""
        capacity = self.keys.shape[2]
        if total <= capacity:
            return
        while capacity < total:
            capacity *= 2
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = torch.empty((*old.shape[:2], capacity, old.shape[3]), dtype=old.dtype)
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def view_cache(self) -> ViewCache:
        """A Cache writing straight into this buffer (batch of one); call `reserve` first."""
        return ViewCache(self.keys.unsqueeze(1), self.values.unsqueeze(1), self.length)


class ViewLayer(DynamicLayer):
    """A cache layer over a preallocated [batch, heads, capacity, dim] buffer."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, offset: int) -> None:
        super().__init__()
        self.buf_keys, self.buf_values, self.offset = keys, values, offset
        self.keys, self.values = keys[:, :, :offset], values[:, :, :offset]
        self.is_initialized, self.device = True, keys.device

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.offset + key_states.shape[-2]
        self.buf_keys[:, :, self.offset : end] = key_states
        self.buf_values[:, :, self.offset : end] = value_states
        self.keys, self.values = self.buf_keys[:, :, :end], self.buf_values[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.offset


class ViewCache(Cache):
    """Per-layer views of [layers, batch, heads, capacity, dim] buffers, all at one `offset`."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, offset: int) -> None:
        super().__init__(layers=[ViewLayer(k, v, offset) for k, v in zip(keys, values, strict=True)])
