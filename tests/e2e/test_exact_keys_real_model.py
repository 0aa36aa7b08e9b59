"""Token-exact keys with the real model: the gateway predicts the replica's `cached_tokens`.

One real SmolLM2 replica publishing KV events, and two gateways in front of it, both keying
prompts with the model's own chat template and tokenizer (`tokenizer: "model:smollm2"`):

- `events`: the replica's KV-event feed mirrored into an exact table. Before each turn the test
  waits until that table holds what the replica's cache holds (`/debug/kv_cache`), then the
  prediction must match what the replica reports within one block, and from turn 2 on come
  from the events rung;
- `history`: no feed; the gateway's warm index of what it routed there, plus each answer
  (recorded after the request by tokenizing the conversation with the answer appended), must
  predict the next turn within one block too.

In both, the replica's `prompt_tokens` must equal the gateway's token count: template and
tokenizer are the engine's own. A 4-turn chat per rung, 8-token greedy answers, 1 torch thread.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.real_replica import MODEL, RealReplica, start_real_replica
from tests.helpers import free_port
from tests.integration.gateway_procs import Gateway, running, start_gateway
from tests.integration.reliability_tools import eventually

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]
REPLICA = "real-0"
QUESTIONS = ("Which box is red?", "And which one is blue?", "Where is box 4 kept?", "Thanks. Anything else?")


@dataclass
class Setup:
    replica: RealReplica
    block_size: int
    events: Gateway  # tokenizer + the replica's KV events
    history: Gateway  # tokenizer only


@dataclass
class Turn:
    prompt_tokens: int  # the gateway's exact count (explain's prompt_tokens_estimate in token mode)
    predicted: int
    evidence: str
    reported_prompt: int
    reported_cached: int
    completion: int  # the answer's tokens (the replica computed KV for all but the last)


def kv_cache(replica: RealReplica) -> dict[str, Any]:
    return httpx.get(f"{replica.url}/debug/kv_cache", timeout=5).json()


def feed(gateway: Gateway) -> dict[str, Any]:
    return gateway.replicas(MODEL)[REPLICA]["kv_events"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp_path: Path = tmp_path_factory.mktemp("exact-keys")
    events, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    with running() as track:
        replica = track(
            start_real_replica(
                REPLICA, "--kv-events-endpoint", events, "--kv-events-replay-endpoint", replay, threads=1
            )
        )
        block_size = int(kv_cache(replica)["block_size"])
        # A generous tokenize budget: on a busy 2-core machine a miss would fall back to characters.
        prefix = {"tokenizer": "model:smollm2", "block_tokens": block_size, "tokenize_budget_ms": 2000}

        def pool(**replica_extra: Any) -> dict[str, Any]:
            return {
                MODEL: {
                    "replicas": [{"url": replica.url, "name": REPLICA, **replica_extra}],
                    "routing": {"policy": "prefix_affinity", "prefix": prefix},
                }
            }

        with_events = track(start_gateway(tmp_path, pool(kv_events={"endpoint": events, "replay_endpoint": replay})))
        history = track(start_gateway(tmp_path, pool()))
        eventually(lambda: feed(with_events)["certain"], timeout_s=20)
        yield Setup(replica, block_size, with_events, history)


def system_prompt() -> str:
    """Fresh per conversation (the session id leads), so neither rung finds the other's prefix warm."""
    rules = " ".join(f"Box {i} is {('red', 'blue', 'green')[i % 3]} on shelf {i % 5}." for i in range(12))
    return f"Session {uuid.uuid4().hex}. You are a warehouse assistant; answer briefly. {rules}"


def body(messages: list[dict[str, str]]) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}


def explain(gateway: Gateway, messages: list[dict[str, str]]) -> dict[str, Any]:
    answer = httpx.post(f"{gateway.url}/admin/route/explain", json=body(messages), timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def prediction(explained: dict[str, Any]) -> int:
    return next(c["cached_tokens"] for c in explained["candidates"] if c["replica"] == REPLICA)


def converse(setup: Setup, gateway: Gateway, before_turn: Any) -> list[Turn]:
    messages: list[dict[str, str]] = [{"role": "system", "content": system_prompt()}]
    turns: list[Turn] = []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        explained = before_turn(messages, turns)
        assert explained["prefix_keys"] == "tokens", explained  # token-exact, not the character fallback
        answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=body(messages), timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.headers["X-Replica-Id"] == REPLICA
        data = answer.json()
        usage = data["usage"]
        turns.append(
            Turn(
                explained["prompt_tokens_estimate"],
                prediction(explained),
                explained["evidence"][REPLICA],
                usage["prompt_tokens"],
                usage["prompt_tokens_details"]["cached_tokens"],
                usage["completion_tokens"],
            )
        )
        messages.append({"role": "assistant", "content": data["choices"][0]["message"]["content"]})
    return turns


def check(turns: list[Turn], tolerance: int) -> None:
    for n, turn in enumerate(turns, 1):
        assert turn.reported_prompt == turn.prompt_tokens, (n, turn)  # template + tokenizer match the engine
        assert abs(turn.predicted - turn.reported_cached) <= tolerance, (n, turn)
        if n >= 2:
            assert turn.reported_cached > 0, (n, turn)


def test_events_rung_predicts_the_replicas_cached_tokens(setup: Setup) -> None:
    gateway = setup.events

    def mirrored() -> bool:
        state = feed(gateway)
        return bool(state["certain"]) and state["blocks"] == kv_cache(setup.replica)["cached_blocks"]

    def before_turn(messages: list[dict[str, str]], turns: list[Turn]) -> dict[str, Any]:
        eventually(mirrored, timeout_s=15, interval_s=0.1)
        return explain(gateway, messages)

    turns = converse(setup, gateway, before_turn)
    print(f"events rung (block {setup.block_size}):", *turns, sep="\n  ")
    check(turns, 0)  # exact: the replica's own events
    for n, turn in enumerate(turns[1:], 2):
        assert turn.evidence == "events", (n, turn)


def test_history_rung_predicts_the_next_turn_from_the_recorded_answer(setup: Setup) -> None:
    gateway = setup.history

    def before_turn(messages: list[dict[str, str]], turns: list[Turn]) -> dict[str, Any]:
        explained = explain(gateway, messages)
        if turns:
            # The answer is recorded off the request path, after the response: give it a moment to
            # land (the prediction grows past the previous prompt's blocks), but assert regardless.
            floor = turns[-1].prompt_tokens // setup.block_size * setup.block_size
            deadline = time.monotonic() + 2
            while prediction(explained) <= floor and time.monotonic() < deadline:
                time.sleep(0.1)
                explained = explain(gateway, messages)
        return explained

    turns = converse(setup, gateway, before_turn)
    print(f"history rung (block {setup.block_size}):", *turns, sep="\n  ")
    check(turns, setup.block_size)  # the bar; the recorded answer stops where the replica's KV does
    for n, turn in enumerate(turns[1:], 2):
        assert turn.evidence == "history", (n, turn)
