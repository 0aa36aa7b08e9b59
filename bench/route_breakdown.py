"""Where one routing decision's time goes, part by part, at an 8k-token prompt and 64 replicas:
hashing the prompt (character blocks), tokenizing it with the model's tokenizer (from scratch and
with the previous turn cached; needs the real model installed), the memory index's lookup over all
candidates and its record on the chosen one, and `prefix_affinity.choose` (per call and per candidate).
`bench/routing_cost.py` measures the whole `Router.route`; this splits it.

    .venv/bin/python -m bench.route_breakdown
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from gateway.config.pools import PrefixConfig
from gateway.index.memory import MemoryIndex
from gateway.prompt import prefix_keys as prefix
from gateway.request.decision import Candidate
from gateway.routing.policies.registry import build_policy
from gateway.view import RequestView
from lab.workloads import words

REPLICAS = 64


def per_call_us(work: Callable[[], Any], repeat: int) -> float:
    """Best of five rounds: the machine is shared, the minimum is the part's own cost."""
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            work()
        rounds.append((time.perf_counter() - start) / repeat * 1e6)
    return min(rounds)


def main() -> None:
    rng = random.Random(0)
    system = {"role": "system", "content": words(rng, 800)}
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": words(rng, 480)} for i in range(9)]
    body = {"model": "m", "messages": [system, *turns]}
    view = RequestView("r", "chat", "m", True, body, b"")
    params = PrefixConfig()
    text, _ = prefix.render_chat(body)
    keyed = prefix.compute(view, params)
    print(f"prompt: {len(text)} characters, {len(keyed.block_hashes)} character blocks, ~{keyed.prompt_tokens} tokens")
    print(f"  hash the prompt: {per_call_us(lambda: prefix.compute(view, params), 50):.0f} µs")

    index = MemoryIndex(65536)
    ids = [f"replica-{i}" for i in range(REPLICAS)]
    for i, replica in enumerate(ids):  # a shared system prompt everywhere, the conversation on one replica
        index.record(replica, keyed.block_hashes if i == 0 else keyed.block_hashes[:60])
    lookup_us = per_call_us(lambda: index.match_now(keyed.block_hashes, ids), 200)
    print(f"  index lookup, {REPLICAS} candidates: {lookup_us:.0f} µs")
    record_us = per_call_us(lambda: index.record(ids[0], keyed.block_hashes), 200)
    print(f"  index record on the chosen replica: {record_us:.0f} µs")
    rounds = []  # on a replica holding only the system prompt, the conversation's tail is new
    for _ in range(5):
        cold = MemoryIndex(65536)
        for replica in ids:
            cold.record(replica, keyed.block_hashes[:60])
        start = time.perf_counter()
        for replica in ids:
            cold.record(replica, keyed.block_hashes)
        rounds.append((time.perf_counter() - start) / len(ids) * 1e6)
    print(f"  index record on a replica holding only the system prompt: {min(rounds):.0f} µs")

    policy = build_policy("prefix_affinity", {"seed": 0}, "bench")
    view.block_hashes, view.prompt_tokens_estimate = keyed.block_hashes, keyed.prompt_tokens
    view.preamble_tokens, view.preamble_key, view.tokens_per_block = (
        keyed.preamble_tokens,
        keyed.preamble_key,
        keyed.tokens_per_block,
    )
    matched = index.match_now(keyed.block_hashes, ids)
    candidates = [
        Candidate(r, in_flight=rng.randrange(8), cached_tokens=int(matched[r] * keyed.tokens_per_block)) for r in ids
    ]
    choose_us = per_call_us(lambda: policy.choose(view, candidates), 200)
    print(f"  prefix_affinity.choose: {choose_us:.0f} µs ({choose_us / REPLICAS:.1f} µs per candidate)")

    try:
        from gateway.prompt.tokenizers import build_prompt_tokenizer

        tokenizer = build_prompt_tokenizer("model:smollm2")
    except Exception as exc:  # noqa: BLE001 - the real model is optional here
        print(f"  (tokenizer skipped: {exc})")
        return
    shorter = {**body, "messages": body["messages"][:-2]}

    def scratch() -> None:
        tokenizer._cache.clear()  # noqa: SLF001 - time the cold path
        tokenizer.encode("chat", body)

    def incremental() -> None:
        tokenizer._cache.clear()  # noqa: SLF001
        tokenizer.encode("chat", shorter)  # the previous turn, as the conversation's last request left it
        start = time.perf_counter()
        tokenizer.encode("chat", body)
        timings.append(time.perf_counter() - start)

    encoded = tokenizer.encode("chat", body)
    assert encoded is not None
    timings: list[float] = []
    scratch_ms = per_call_us(scratch, 5) / 1000
    print(f"  model tokenizer, {len(encoded.token_ids)}-token chat from scratch: {scratch_ms:.1f} ms")
    for _ in range(20):
        incremental()
    print(f"  model tokenizer, same chat with the previous turn cached: {min(timings) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
