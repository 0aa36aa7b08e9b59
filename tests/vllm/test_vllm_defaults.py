"""Fixes of issue 21 that only a gateway of its own shows, each in front of the session's vLLM pair
(a gateway starts in seconds; no extra vLLM): the block size learned when unset and a configured
one that differs logged once and exported, a fresh gateway's first request keyed by tokens within
the default tokenize budget (the template compile happens at start), and one conversation's own
system prompt never spread with vLLM's 128-token blocks while its traffic is all there is."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from lab import vllm_replica
from tests.integration.gateway_procs import Gateway, start_gateway
from tests.integration.reliability_tools import eventually
from tests.vllm.conftest import MODEL, VLLMPair, chat_turn, explain, feed, gateway_config
from tests.vllm.test_vllm_cache_state import settled, system_prompt

pytestmark = pytest.mark.timeout(420)  # may be the first vLLM test: waits for the session's start-up
REPLICAS = ("vllm-0", "vllm-1")


@contextmanager
def own_gateway(pair: VLLMPair, tmp_path: Path, **prefix: Any) -> Iterator[Gateway]:
    """A gateway of this test's in front of the session's replicas; a None in `prefix` unsets that key."""
    config = gateway_config(pair)
    section = config[MODEL]["routing"]["prefix"]
    section.update(prefix)
    config[MODEL]["routing"]["prefix"] = {k: v for k, v in section.items() if v is not None}
    gw = start_gateway(tmp_path, config, timeouts={"connect_s": 2.0, "first_byte_s": 120.0})
    try:
        eventually(lambda: all(feed(gw, r)["certain"] for r in REPLICAS), timeout_s=30)
        yield gw
    finally:
        gw.stop()


def logged(gw: Gateway, event: str) -> list[dict[str, Any]]:
    lines = (line for line in gw.proc.output().splitlines() if line.startswith("{"))
    return [entry for entry in map(json.loads, lines) if entry.get("event") == event]


def mismatch_gauge(gw: Gateway, replica: str) -> float | None:
    prefix = f'affinity_gateway_block_tokens_mismatch{{model_name="{MODEL}",replica="{replica}"}} '
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    return next((float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)), None)


def test_defaults_learn_the_block_size_and_key_the_first_request_by_tokens(vllm: VLLMPair, tmp_path: Path) -> None:
    """What a user writes: a tokenizer, nothing else (block_tokens unset, tokenize_budget_ms 50)."""
    with own_gateway(vllm, tmp_path, block_tokens=None, tokenize_budget_ms=None) as gw:
        eventually(lambda: len(logged(gw, "block_tokens_learned")) == 1, timeout_s=10)
        assert logged(gw, "block_tokens_learned")[0]["block_tokens"] == vllm_replica.BLOCK_TOKENS
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system_prompt()},
            {"role": "user", "content": "Which shelf holds box 3?"},
        ]
        first = explain(gw, {"model": MODEL, "messages": messages, "max_tokens": 8})  # its first tokenization
        assert first["prefix_keys"] == "tokens", first  # within 50 ms: the template was compiled at start
        assert first["prefix_blocks"] == first["prompt_tokens_estimate"] // vllm_replica.BLOCK_TOKENS, first
        turn, text = chat_turn(gw, messages)
        settled(gw, turn.replica)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "And box 7?"}]
        again, _ = chat_turn(gw, messages)
        assert again.reported > 0 and again.predicted == again.reported, again


def test_a_configured_block_size_that_differs_is_logged_once_and_exported(vllm: VLLMPair, tmp_path: Path) -> None:
    with own_gateway(vllm, tmp_path, block_tokens=16) as gw:
        eventually(lambda: all(mismatch_gauge(gw, r) == vllm_replica.BLOCK_TOKENS for r in REPLICAS), timeout_s=10)
        batches = {r: feed(gw, r)["batches"] for r in REPLICAS}
        turn, _ = chat_turn(gw, [{"role": "system", "content": system_prompt()}, {"role": "user", "content": "Hi"}])
        # Its BlockStored events say 128 as well (its 16-token speculation is never confirmed: no `settled`).
        eventually(lambda: feed(gw, turn.replica)["batches"] > batches[turn.replica], timeout_s=20)
        warnings = logged(gw, "block_tokens_mismatch")
        assert sorted(w["replica"] for w in warnings) == list(REPLICAS), warnings  # once per replica
        assert all(w["replica_block_size"] == 128 and w["configured_block_tokens"] == 16 for w in warnings)


def test_a_conversations_own_system_prompt_is_never_spread(vllm: VLLMPair, tmp_path: Path) -> None:
    """One conversation alone, short turns behind a system prompt of its own: with 128-token blocks its
    history stays inside the block that straddles the prompt's end for turns on end, and the system
    prompt, seen on every turn and on nothing else, looked like a popular one wanting more replicas."""
    with own_gateway(vllm, tmp_path) as gw:
        messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt()}]
        turns = []
        for n in range(6):
            messages.append({"role": "user", "content": f"Box {n}?"})
            turn, text = chat_turn(gw, messages, max_tokens=4)
            turns.append(turn)
            messages.append({"role": "assistant", "content": text})
            settled(gw, turn.replica)
        assert len({t.replica for t in turns}) == 1, turns
        assert all(t.reported > 0 and t.predicted == t.reported for t in turns[1:]), turns
