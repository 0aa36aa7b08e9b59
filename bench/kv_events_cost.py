"""What following KV events costs a gateway: CPU per event batch and memory per mirrored block.

Builds the batches a replica publishes (the stub's own encoder, vLLM's array encoding): for each
simulated request one prefill batch storing its prompt's blocks, then one single-block batch per
`block_size` decoded tokens, and removals as the table passes its capacity. Times the gateway
side only: `decode_batch` (msgpack) plus applying the events to `ExactTables` (own chain keys
over the token ids, the engine-hash map), i.e. what the subscriber task does per batch on the
event loop. Memory: tracemalloc growth of the tables per block held.

    .venv/bin/python -m bench.kv_events_cost [--prompt-tokens 2048] [--blocks 30000]
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc

import msgpack

from gateway.index.exact import ExactTables
from gateway.index.kv_events.decode import Removed, Stored, decode_batch
from gateway.prompt import prefix_keys as prefix
from replica_stub.block_pool import BlockRemoved, BlockStored
from replica_stub.kv_events import encode_event

BLOCK = 16


def batches(requests: int, prompt_tokens: int, answer_tokens: int, capacity: int, seed: int) -> list[bytes]:
    """Encoded batches for `requests` requests of random tokens (no sharing: the worst case)."""
    rng = random.Random(seed)
    out: list[bytes] = []
    held: list[int] = []
    next_hash = 1
    for _ in range(requests):
        tokens = [rng.randrange(50_000) for _ in range(prompt_tokens + answer_tokens)]
        parent = None
        first = prompt_tokens // BLOCK
        runs = [(0, first)] + [(i, i + 1) for i in range(first, len(tokens) // BLOCK)]
        for start, end in runs:
            hashes = tuple(range(next_hash, next_hash + end - start))
            next_hash += end - start
            stored = BlockStored(hashes, parent, tuple(tokens[start * BLOCK : end * BLOCK]), BLOCK)
            events: list[BlockStored | BlockRemoved] = [stored]
            held.extend(hashes)
            if len(held) > capacity:
                gone, held = held[: len(held) - capacity], held[len(held) - capacity :]
                events.append(BlockRemoved(tuple(gone)))
            out.append(msgpack.packb([time.time(), [encode_event(e, "array") for e in events], None]))
            parent = hashes[-1]
    return out


def apply(tables: ExactTables, payload: bytes) -> None:
    for event in decode_batch(payload):
        if isinstance(event, Stored):
            tables.stored("r", event.block_hashes, event.parent, event.token_ids, event.block_size)
        elif isinstance(event, Removed):
            tables.removed("r", event.block_hashes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--answer-tokens", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=30_000, help="replica capacity in blocks")
    args = parser.parse_args()
    payloads = batches(args.requests, args.prompt_tokens, args.answer_tokens, args.blocks, seed=0)
    per_request = len(payloads) // args.requests
    print(
        f"{len(payloads)} batches ({args.requests} requests × {args.prompt_tokens}+{args.answer_tokens} tokens), "
        f"capacity {args.blocks} blocks"
    )
    spent = {"prefill": 0.0, "decode": 0.0}
    tables = ExactTables(prefix.model_seed("m"), BLOCK)
    for i, payload in enumerate(payloads):
        started = time.perf_counter()
        apply(tables, payload)
        spent["decode" if i % per_request else "prefill"] += time.perf_counter() - started
    print(f"  a {args.prompt_tokens // BLOCK}-block prefill batch: {spent['prefill'] / args.requests * 1e6:.0f} µs")
    print(f"  a one-block decode batch: {spent['decode'] / (len(payloads) - args.requests) * 1e6:.1f} µs")
    tables = ExactTables(prefix.model_seed("m"), BLOCK)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for payload in payloads:
        apply(tables, payload)
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    print(f"  memory: {grown / tables.size('r'):.0f} bytes per mirrored block ({tables.size('r')} held)")


if __name__ == "__main__":
    main()
