"""End to end with the real model: prefix_affinity against round_robin over two real replicas.

A 3-turn conversation under a ~600-token system prompt. Under prefix_affinity the gateway must
send turns 2 and 3 to the replica that holds the conversation so far, that replica must report
(and really skip) the prefill of everything the previous turns computed, and so turns 2 and 3
must reach their first token sooner than the same conversation under round_robin, whose second
turn lands on the other replica, where the history is cold (its third is back where the first was).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.e2e.real_replica import MODEL, start_real_replica
from tests.integration.gateway_procs import pool, running, start_gateway

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]
BLOCK = 16
QUESTIONS = ("Which box is red?", "And which one is blue?", "Thanks. Summarise in one sentence.")


def system_prompt() -> str:
    """A fresh ~600-token prompt per conversation, so no run finds another's prefix warm."""
    rules = " ".join(
        f"Rule {i}: box {i} is {('red', 'blue', 'green')[i % 3]} and must stay on shelf {i % 7}." for i in range(38)
    )
    return f"Session {uuid.uuid4().hex}. You are a warehouse assistant. {rules}"


def converse(url: str) -> list[tuple[str, int, int, float]]:
    """Run the conversation through `url`; per turn: (replica, prompt tokens, cached tokens, TTFT s)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt()}]
    turns = []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        body = {
            "model": MODEL,
            "messages": messages,
            "max_tokens": 24,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        text, usage, ttft = [], {}, 0.0
        start = time.monotonic()
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as answer:
            assert answer.status_code == 200, answer.read()
            replica = answer.headers["X-Replica-Id"]
            for line in answer.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = orjson.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    ttft = ttft or time.monotonic() - start
                    text.append(chunk["choices"][0]["delta"]["content"])
                usage = chunk.get("usage") or usage
        messages.append({"role": "assistant", "content": "".join(text)})
        turns.append((replica, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], ttft))
    return turns


def test_affinity_reuses_the_previous_turns_kv_and_beats_round_robin(tmp_path: Path) -> None:
    with running() as track:
        replicas = [track(start_real_replica(f"real-{i}", threads=1)) for i in range(2)]
        urls = [(r.replica_id, r.url) for r in replicas]
        affinity = track(start_gateway(tmp_path, {MODEL: pool(*urls, policy="prefix_affinity")}))
        rotating = track(start_gateway(tmp_path, {MODEL: pool(*urls, policy="round_robin")}))
        warm = converse(affinity.url)
        cold = converse(rotating.url)
    print("prefix_affinity (replica, prompt, cached, ttft):", warm)
    print("round_robin     (replica, prompt, cached, ttft):", cold)
    assert warm[0][1] >= 600 and warm[0][2] == 0
    assert len({replica for replica, *_ in warm}) == 1  # the conversation stayed where its KV is
    for previous, now in zip(warm, warm[1:]):
        assert now[2] >= previous[1] // BLOCK * BLOCK  # the whole previous turn's prompt, by blocks
    assert len({replica for replica, *_ in cold}) == 2  # round robin alternated
    # Turn 2 under round robin lands on the other replica, where the history is cold: a full prefill.
    assert cold[1][2] < BLOCK and warm[1][3] < cold[1][3], (warm[1], cold[1])
    # Turn 3 under round robin is back on turn 1's replica, which holds most of the prompt, so the
    # TTFTs are within noise of each other; affinity still holds more of it (turns 1 and 2).
    assert warm[2][2] >= cold[2][2], (warm[2], cold[2])
