"""The simulator: the stub's tokenization and cache seen exactly, the real policies, reproducible."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gateway.cli.main import main
from gateway.prompt.sim_tokens import apply_chat_template
from lab import wordgen, workloads
from lab.results import summarise
from lab.sim_spec import SimSpec
from lab.simulate import Simulation, simulate
from lab.workloads import Session
from replica_stub.config import StubConfig
from replica_stub.tokenizer import SimTokenizer


def test_message_by_message_encoding_equals_the_stub_template() -> None:
    sim = Simulation(SimSpec(replicas=1))
    messages = [
        {"role": "system", "content": "Be brief.  Really"},
        {"role": "user", "content": "hello wonderful world"},
        {"role": "assistant", "content": "the of and "},
        {"role": "user", "content": "next?"},
    ]
    ids = [t for m in messages for t in sim._encode_message(m)] + sim._generation_prompt
    assert ids == SimTokenizer().encode(apply_chat_template(messages))


def test_a_conversation_hits_its_whole_history_on_one_replica() -> None:
    session = Session("s", 0.0, "system " * 100, ("first " * 300, "second " * 50, "third " * 50), 40)
    results = sorted(simulate([session], SimSpec(replicas=1)), key=lambda r: r.turn)
    assert [r.completion_tokens for r in results] == [40, 40, 40]
    for earlier, later in zip(results, results[1:]):
        # Everything the previous turn saw and said is cached, up to the last partial 16-token block.
        assert earlier.prompt_tokens + 40 - 16 <= later.cached_tokens <= earlier.prompt_tokens + 40
    assert all(r.ttft_s is not None and 0 < r.ttft_s < r.e2e_s for r in results)


def test_reproducible_and_prefix_affinity_beats_round_robin_on_cache() -> None:
    sessions = workloads.multi_turn(users=12, rounds=4, rate_per_s=2.0, seed=5)
    spec = SimSpec(replicas=4, policy="prefix_affinity", seed=1)
    first, second = simulate(sessions, spec), simulate(sessions, spec)
    assert summarise(first) == summarise(second)
    rr = summarise(simulate(sessions, SimSpec(replicas=4, policy="round_robin")))
    pa = summarise(first)
    assert pa.errors == rr.errors == 0 and pa.requests == 48
    assert pa.cached_ratio > rr.cached_ratio + 0.15, (pa.cached_ratio, rr.cached_ratio)
    # Later turns: the 36 requests after each user's first, where a home holds the history.
    later = sorted(r.ttft_s for r in first if r.turn > 0 and r.ttft_s is not None)
    assert len(later) == 36 and pa.later_ttft_p90_s == later[round(0.9 * 35)] < pa.ttft_p90_s


def test_a_small_kv_cache_evicts() -> None:
    sessions = workloads.shared_prefix(
        groups=8, prompts_per_group=4, system_tokens=512, answer_tokens=16, rate_per_s=1.0, seed=1
    )
    big = summarise(simulate(sessions, SimSpec(replicas=1)))
    small = summarise(simulate(sessions, SimSpec(replicas=1, stub=StubConfig(num_gpu_blocks=80).resolved())))
    assert big.cached_ratio > 0.5 and small.cached_ratio < big.cached_ratio / 2, (big.cached_ratio, small.cached_ratio)


def test_closed_loop_keeps_concurrency_sessions_in_flight() -> None:
    sessions = workloads.hot_prefix(requests=12, seed=1)
    results = simulate(sessions, SimSpec(replicas=2, concurrency=3))
    events = sorted([(r.sent_s, 1) for r in results] + [(r.sent_s + r.e2e_s, -1) for r in results])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    assert len(results) == 12 and peak == 3


def test_simulate_command_writes_result_table_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "simulate",
            "-w",
            "hot-prefix",
            "-p",
            "requests=30",
            "--replicas",
            "3",
            "--policies",
            "round_robin,prefix_affinity",
            "-P",
            "prefix_affinity.load_epsilon=0.5",
            "--out",
            str(out),
            "-q",
        ]
    )
    assert code == 0
    result = orjson.loads((out / "result.json").read_bytes())
    assert set(result["runs"]) == {"round_robin", "prefix_affinity"}
    assert result["meta"]["policy_params"] == {"prefix_affinity": {"load_epsilon": 0.5}}
    run = result["runs"]["prefix_affinity"]
    assert run["requests"] == 30 and run["errors"] == 0 and sum(run["replica_share"].values()) == 30
    assert 0 < run["ttft_p50_s"] <= run["ttft_p90_s"] <= run["ttft_p99_s"]
    assert run["later_ttft_p90_s"] is None  # one request per session: no later turns
    assert "| later turns TTFT p90 s |" in (out / "table.md").read_text()
    for name in ("table.md", "ttft_cdf.png", "cached_ratio.png", "load_share.png"):
        assert (out / name).stat().st_size > 100


def test_a_prompt_over_the_context_length_fails_like_the_stub() -> None:
    session = Session("long", 0.0, "", ("word " * 9000,), 10)
    [result] = simulate([session], SimSpec(replicas=1))
    assert not result.ok and result.status == 400


def test_words_and_below_draw_exactly_what_choice_and_randrange_draw() -> None:
    """`workloads.below` inlines `random.Random.randrange`: same seed, same numbers, same RNG state after."""
    import random

    for seed in range(20):
        fast, reference = random.Random(seed), random.Random(seed)
        for count in (0, 1, 5, 300):
            assert workloads.words(fast, count) == " ".join(reference.choice(wordgen.WORDS) for _ in range(count))
        for n in (1, 2, 55, 64, 200, 1000):
            assert workloads.below(fast, n, 50) == [reference.randrange(n) for _ in range(50)]
        assert fast.random() == reference.random()


def test_fast_forwarded_decode_steps_change_no_result(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Plain decode steps skip the scheduler's per-step bookkeeping: every result is bit-identical."""
    cases = [
        (
            workloads.multi_turn(users=8, rounds=3, rate_per_s=2.0, seed=3),
            SimSpec(replicas=2, policy="prefix_affinity"),
        ),
        (
            workloads.multi_turn(users=16, rounds=3, rate_per_s=2.0, seed=0),  # preempts
            SimSpec(
                replicas=2, policy="prefix_affinity", kv_events=True, stub=StubConfig(num_gpu_blocks=300).resolved()
            ),
        ),
        (workloads.hot_prefix(requests=40, rate_per_s=20.0, seed=2), SimSpec(replicas=3, policy="least_loaded")),
        (workloads.agent_loop(sessions=6, seed=1), SimSpec(replicas=2, policy="round_robin", concurrency=3)),
    ]
    for sessions, spec in cases:
        monkeypatch.setattr(Simulation, "fast_forward", False)
        stepwise = Simulation(spec).run(sessions)
        monkeypatch.setattr(Simulation, "fast_forward", True)
        assert Simulation(spec).run(sessions) == stepwise


@pytest.mark.timeout(60)
def test_each_run_is_priced_from_its_reported_tokens(tmp_path: Path) -> None:
    """`--prices` reaches result.json and the table: cost and savings are the price arithmetic on the run's
    token totals, the share saved is of the prompts' uncached price."""
    out = tmp_path / "priced"
    assert (
        main(
            [
                "simulate",
                "-w",
                "multi-turn",
                "-p",
                "users=3",
                "-p",
                "rounds=2",
                "--policies",
                "prefix_affinity",
                "--prices",
                "2,0.5,8",
                "-q",
                "--no-plots",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = orjson.loads((out / "result.json").read_bytes())
    assert result["meta"]["prices"] == {"input": 2.0, "cached_input": 0.5, "output": 8.0}
    run = result["runs"]["prefix_affinity"]
    prompt, cached, completion = run["prompt_tokens"], run["cached_tokens"], run["completion_tokens"]
    assert cached > 0
    assert run["cost"] == pytest.approx(((prompt - cached) * 2.0 + cached * 0.5 + completion * 8.0) / 1e6)
    assert run["saved_by_cache"] == pytest.approx(cached * 1.5 / 1e6)
    assert run["saved_share_of_prompt_cost"] == pytest.approx(run["saved_by_cache"] / (prompt * 2.0 / 1e6))
    assert f"{run['cost']:.4g} | {run['saved_by_cache']:.4g} (" in (out / "table.md").read_text()
