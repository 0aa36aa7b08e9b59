"""Workload generators: deterministic for a seed, and the promised shape, measured on their output
(prefix sharing through the gateway's own block hashing)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gateway.prompt import prefix_keys as prefix
from lab import workloads
from lab.workloads import Session

SMALL = {
    "shared-prefix": {"groups": 4, "prompts_per_group": 5, "system_tokens": 256, "question_tokens": 16},
    "multi-turn": {"users": 6, "rounds": 3},
    "hot-prefix": {"requests": 20},
    "agent-loop": {"sessions": 10},
    "varied-output": {"requests": 20},
}


def first_prompt_blocks(session: Session) -> tuple[int, ...]:
    messages = [{"role": "system", "content": session.system}] if session.system else []
    text, _ = prefix.render_chat({"messages": [*messages, {"role": "user", "content": session.user_turns[0]}]})
    return prefix.chain_hash_text(text, 64, 0, 10_000)


def reusable_fraction(sessions: list[Session]) -> float:
    """Share of first-turn prompt blocks already sent by an earlier request (in arrival order):
    what a perfect prefix cache could skip."""
    seen: set[int] = set()
    hit = total = 0
    for s in sorted(sessions, key=lambda s: s.start_s):
        blocks = first_prompt_blocks(s)
        n = next((i for i, b in enumerate(blocks) if b not in seen), len(blocks))
        hit, total = hit + n, total + len(blocks)
        seen.update(blocks)
    return hit / total


@pytest.mark.parametrize("name", list(SMALL))
def test_deterministic_for_a_seed(name: str) -> None:
    a = workloads.build(name, SMALL[name], seed=3)
    assert a == workloads.build(name, SMALL[name], seed=3)
    assert a != workloads.build(name, SMALL[name], seed=4)
    starts = [s.start_s for s in a]
    assert starts[0] == 0.0 and all(t >= 0 for t in starts)


def test_shared_prefix_shape() -> None:
    sessions = workloads.build("shared-prefix", SMALL["shared-prefix"], seed=1)
    assert len(sessions) == 20 and all(len(s.user_turns) == 1 and s.max_tokens == 256 for s in sessions)
    assert len({s.system for s in sessions}) == 4
    assert len(sessions[0].system.split()) == 256 + 3  # "Group g instructions." + 256 words
    # Every group's first request pays in full, the other 4 of 5 reuse the ~256-word system prompt.
    assert 0.65 < reusable_fraction(sessions) < 0.8
    assert [s.session_id for s in sessions] != sorted(s.session_id for s in sessions)  # groups interleaved


def test_multi_turn_shape() -> None:
    sessions = workloads.build("multi-turn", {"users": 8, "rounds": 4, "systems": 2, "first_turn_tokens": 500}, seed=1)
    assert len(sessions) == 8 and all(len(s.user_turns) == 4 for s in sessions)
    assert len({s.system for s in sessions}) == 2
    assert all(len(s.user_turns[0].split()) == 500 + 4 for s in sessions)  # the private document
    # First turns share only the system prompt: the private document is most of each prompt.
    assert reusable_fraction(sessions) < 0.4


def test_hot_prefix_shape() -> None:
    sessions = workloads.build("hot-prefix", {"requests": 50, "rate_per_s": 10}, seed=1)
    assert len({s.system for s in sessions}) == 1
    assert reusable_fraction(sessions) > 0.9
    mean_gap = sessions[-1].start_s / 49
    assert 0.05 < mean_gap < 0.2  # Poisson at 10/s


def test_agent_loop_hops_and_growth() -> None:
    sessions = workloads.build("agent-loop", {"sessions": 40, "min_hops": 3, "max_hops": 8}, seed=2)
    hops = [len(s.user_turns) for s in sessions]
    assert min(hops) >= 3 and max(hops) <= 8 and len(set(hops)) > 2
    assert all(s.think_s > 0 and s.user_turns[1].startswith("Tool output") for s in sessions)
    assert len({s.system for s in sessions}) == 1


def test_varied_output_mixes_short_and_long_answers() -> None:
    sessions = workloads.build("varied-output", {"requests": 400, "short_tokens": 32, "long_tokens": 512}, seed=1)
    lengths = [s.max_tokens for s in sessions]
    long = [n for n in lengths if n > 32]
    assert all(16 <= n <= 32 for n in lengths if n <= 32) and all(256 <= n <= 512 for n in long)
    assert 0.12 < len(long) / len(lengths) < 0.28  # long_share 0.2
    assert all(len(s.user_turns) == 1 and not s.system for s in sessions)


def test_trace_replays_shared_blocks(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]},
        {"timestamp": 500, "input_length": 1100, "output_length": 20, "hash_ids": [1, 2, 3]},
        {"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [4, 5]},
    ]
    path.write_text("\n".join(orjson.dumps(r).decode() for r in rows) + "\n")
    sessions = workloads.build("trace", {"path": str(path)})
    assert [s.start_s for s in sessions] == [0.0, 0.5, 1.0]
    assert [len(s.user_turns[0].split()) for s in sessions] == [1024, 1100, 600]
    assert [s.max_tokens for s in sessions] == [10, 20, 5]
    assert sessions[1].user_turns[0].startswith(sessions[0].user_turns[0])  # blocks 1, 2 shared
    assert not sessions[2].user_turns[0].startswith(sessions[0].user_turns[0][:100])
    faster = workloads.build("trace", {"path": str(path), "rate_per_s": "8"})
    assert faster[-1].start_s == pytest.approx(0.25)  # 2 gaps at 8/s
    assert workloads.build("trace", {"path": str(path)}, seed=0) == sessions


def test_build_converts_and_rejects_parameters() -> None:
    sessions = workloads.build("hot-prefix", {"requests": "7", "rate-per-s": "5"})
    assert len(sessions) == 7
    with pytest.raises(ValueError, match="no parameter 'nope'"):
        workloads.build("hot-prefix", {"nope": "1"})
    with pytest.raises(ValueError, match="unknown workload"):
        workloads.build("nope", {})
