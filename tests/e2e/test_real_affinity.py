"""End to end with the real model: a prefix_affinity gateway in front of two real replicas.

A 3-turn conversation under a ~600-token system prompt: the gateway must send turns 2 and 3
to the replica that holds the conversation so far, and that replica must report (and really
skip) the prefill of everything the previous turns already computed.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.real_replica import MODEL, start_real_replica
from tests.integration.gateway_procs import pool, running, start_gateway

pytestmark = [pytest.mark.model, pytest.mark.timeout(240)]
BLOCK = 16
QUESTIONS = ("Which box is red?", "And which one is blue?", "Thanks. Summarise in one sentence.")


def system_prompt() -> str:
    rules = " ".join(f"Rule {i}: box {i} is {('red', 'blue', 'green')[i % 3]} and must stay on shelf {i % 7}."
                     for i in range(38))
    return f"Session {uuid.uuid4().hex}. You are a warehouse assistant. {rules}"


def test_conversation_turns_reuse_the_previous_turns_kv(tmp_path: Path) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt()}]
    with running() as track:
        replicas = [track(start_real_replica(f"real-{i}", threads=1)) for i in range(2)]
        routing = pool(*((r.replica_id, r.url) for r in replicas), policy="prefix_affinity")
        # preamble_weight 1: the system prompt the replica holds attracts the conversation in full
        # (the default 0 treats it as soon warm everywhere, and a short turn 1 adds too little).
        routing["routing"]["params"] = {"prefill_s_per_token": 0.0008, "preamble_weight": 1.0}
        gateway = track(start_gateway(tmp_path, {MODEL: routing}))
        turns = []
        for question in QUESTIONS:
            messages.append({"role": "user", "content": question})
            answer = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=120,
                                json={"model": MODEL, "messages": messages, "max_tokens": 24, "temperature": 0})
            assert answer.status_code == 200, answer.text
            body = answer.json()
            messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
            usage = body["usage"]
            turns.append((answer.headers["X-Replica-Id"], usage["prompt_tokens"],
                          usage["prompt_tokens_details"]["cached_tokens"]))
    print("turns (replica, prompt_tokens, cached_tokens):", turns)
    assert turns[0][1] >= 600 and turns[0][2] == 0
    assert len({replica for replica, _, _ in turns}) == 1  # the conversation stayed where its KV is
    for (_, previous_prompt, _), (_, _, now_cached) in zip(turns, turns[1:]):
        assert now_cached >= previous_prompt // BLOCK * BLOCK  # the whole previous turn's prompt, by blocks
