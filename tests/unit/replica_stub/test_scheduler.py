from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replica_stub.request import RequestStatus
from replica_stub.scheduler import BATCHING, Batching
from tests.unit.replica_stub.factories import EOS, make_request, make_scheduler, run_step


def test_admitted_request_prefills_then_decodes_one_token_per_step() -> None:
    sched = make_scheduler()
    req = make_request(10, max_tokens=3)
    sched.add_request(req)
    out = sched.schedule()
    assert [(s.request, s.num_new_tokens, s.samples) for s in out.scheduled] == [(req, 10, True)]
    sched.update_from_output(out, {req.request_id: 7})
    assert req.num_computed_tokens == 10 and req.output_token_ids == [7]
    out = sched.schedule()
    assert out.scheduled[0].num_new_tokens == 1
    outputs = sched.update_from_output(out, {req.request_id: 8})
    assert outputs[0].new_token_ids == [8] and outputs[0].finish_reason is None
    outputs = run_step(sched)
    assert outputs[0].finish_reason == "length" and req.status is RequestStatus.FINISHED_LENGTH
    assert not sched.has_unfinished_requests() and sched.kv.pool.num_free_blocks == 64


def test_eos_finishes_with_stop_unless_ignore_eos() -> None:
    sched = make_scheduler()
    stops, ignores = make_request(5, max_tokens=5), make_request(5, max_tokens=5, ignore_eos=True)
    sched.add_request(stops)
    sched.add_request(ignores)
    outputs = run_step(sched, token=EOS)
    assert {o.request_id: o.finish_reason for o in outputs} == {stops.request_id: "stop", ignores.request_id: None}


def test_admission_stops_at_max_num_seqs_and_a_finished_slot_goes_to_the_next_waiter() -> None:
    sched = make_scheduler(max_num_seqs=2)
    reqs = [make_request(4, max_tokens=n) for n in (1, 5, 5)]
    for req in reqs:
        sched.add_request(req)
    out = sched.schedule()
    assert [s.request for s in out.scheduled] == reqs[:2] and sched.num_waiting == 1
    outputs = sched.update_from_output(out, {r.request_id: 7 for r in reqs[:2]})
    assert [o.finish_reason for o in outputs] == ["length", None] and sched.num_running == 1
    out = sched.schedule()
    assert [(s.request, s.num_new_tokens) for s in out.scheduled] == [(reqs[1], 1), (reqs[2], 4)]
    assert sched.num_waiting == 0


def test_every_running_sequence_advances_in_the_same_step() -> None:
    sched = make_scheduler(max_num_seqs=4)
    reqs = [make_request(6, max_tokens=10) for _ in range(4)]
    for req in reqs:
        sched.add_request(req)
    run_step(sched)
    out = sched.schedule()
    assert sorted(s.num_new_tokens for s in out.scheduled) == [1, 1, 1, 1]


def test_prefix_hit_skips_cached_blocks_but_recomputes_the_last_token() -> None:
    sched = make_scheduler(block_size=4)
    prompt = list(range(100, 112))  # 3 full blocks
    first = make_request(prompt, max_tokens=1)
    sched.add_request(first)
    run_step(sched)
    second = make_request(prompt, max_tokens=1)
    sched.add_request(second)
    out = sched.schedule()
    assert second.num_cached_tokens == 8 and out.scheduled[0].num_new_tokens == 4
    assert out.admitted == [second]


def test_generated_tokens_blocks_are_cached_for_the_next_turn() -> None:
    sched = make_scheduler(block_size=4)
    first = make_request(list(range(6)), max_tokens=6, ignore_eos=True)
    sched.add_request(first)
    for token in range(50, 56):
        run_step(sched, token=token)
    history = first.all_token_ids  # 6 prompt + 6 generated; KV of all but the last was computed
    follow_up = make_request(history + [77, 78, 79], max_tokens=1)
    sched.add_request(follow_up)
    sched.schedule()
    assert follow_up.num_cached_tokens == 8  # blocks [0:4], [4:8]; block [8:12] held the uncomputed last token


def test_token_budget_chunks_a_long_prefill() -> None:
    sched = make_scheduler(max_num_batched_tokens=16, max_model_len=128)
    req = make_request(40, max_tokens=1)
    sched.add_request(req)
    chunks = []
    while not req.is_finished:
        out = sched.schedule()
        chunks.append(out.scheduled[0].num_new_tokens)
        sched.update_from_output(out, {s.request.request_id: 7 for s in out.scheduled if s.samples})
    assert chunks == [16, 16, 8]


def test_abort_frees_blocks_of_running_and_waiting_requests() -> None:
    sched = make_scheduler(max_num_seqs=1)
    running, waiting = make_request(8, max_tokens=5), make_request(8, max_tokens=5)
    sched.add_request(running)
    sched.add_request(waiting)
    out = sched.schedule()
    sched.finish_requests([running.request_id, waiting.request_id], RequestStatus.FINISHED_ABORTED)
    assert sched.update_from_output(out, {running.request_id: 7}) == []  # aborted mid-step: ignored
    assert not sched.has_unfinished_requests() and sched.kv.pool.num_free_blocks == 64
    assert sched.schedule().finished_request_ids == {running.request_id, waiting.request_id}


def test_lru_eviction_when_kv_capacity_is_exceeded() -> None:
    sched = make_scheduler(num_blocks=6, block_size=4, max_model_len=24)
    old = list(range(1000, 1012))
    for prompt in (old, list(range(2000, 2012)), list(range(3000, 3012))):
        sched.add_request(make_request(prompt, max_tokens=1))
        run_step(sched)
    again = make_request(old, max_tokens=1)
    sched.add_request(again)
    sched.schedule()
    assert again.num_cached_tokens == 0


def test_preemption_when_running_requests_outgrow_the_cache() -> None:
    sched = make_scheduler(num_blocks=4, block_size=4, max_num_seqs=2, max_model_len=16)
    a, b = make_request(7, max_tokens=8, ignore_eos=True), make_request(7, max_tokens=8, ignore_eos=True)
    sched.add_request(a)
    sched.add_request(b)
    finished = []
    for _ in range(40):
        finished += [o.request_id for o in run_step(sched) if o.finish_reason]
        if not sched.has_unfinished_requests():
            break
    assert sorted(finished) == sorted([a.request_id, b.request_id])
    assert sched.num_preemptions >= 1 and len(a.output_token_ids) == len(b.output_token_ids) == 8


@pytest.mark.parametrize("batching", BATCHING)
@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 30), st.integers(1, 12), st.integers(0, 3)), min_size=1, max_size=12),
    st.integers(8, 24),
    st.integers(1, 4),
    st.integers(4, 64),
)
def test_any_workload_completes_and_releases_every_block(
    batching: Batching, specs: list[tuple[int, int, int]], num_blocks: int, max_num_seqs: int, budget: int
) -> None:
    """Random prompts (some sharing prefixes) on a small cache: every request ends with its
    full output, running never exceeds max_num_seqs, no block stays referenced, and under static
    batching a request only ever runs beside members of its own batch."""
    sched = make_scheduler(
        num_blocks=num_blocks,
        block_size=4,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=num_blocks * 4,
        batching=batching,
    )
    requests = []
    for prompt_len, max_tokens, family in specs:
        prompt = [family * 1000 + i for i in range(min(prompt_len, num_blocks * 4 - max_tokens))]
        if not prompt:
            continue
        requests.append(make_request(prompt, max_tokens=max_tokens, ignore_eos=True))
        sched.add_request(requests[-1])
    for _ in range(2000):
        if not sched.has_unfinished_requests():
            break
        run_step(sched)
        assert sched.num_running <= max_num_seqs
        assert batching == "continuous" or {r.request_id for r in sched.running} <= sched.batch
    assert not sched.has_unfinished_requests()
    assert all(len(r.output_token_ids) == r.sampling.max_tokens for r in requests)
    assert sched.kv.pool.num_free_blocks == num_blocks
    assert all(b.ref_cnt == 0 for b in sched.kv.pool.blocks)
