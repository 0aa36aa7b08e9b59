"""Static against continuous batching in the scheduler: who may join the running batch, and when."""

from __future__ import annotations

import pytest

from replica_stub.request import Request, RequestStatus
from replica_stub.scheduler import Batching, Scheduler
from tests.unit.replica_stub.factories import make_request, make_scheduler, run_step

pytestmark = pytest.mark.timeout(30)


def _long_then_short(batching: Batching) -> tuple[Scheduler, Request, Request]:
    """A long request that has started decoding, then a short one submitted behind it."""
    sched = make_scheduler(batching=batching)
    long = make_request(8, max_tokens=20, ignore_eos=True)
    sched.add_request(long)
    run_step(sched)
    run_step(sched)
    short = make_request(8, max_tokens=2, ignore_eos=True)
    sched.add_request(short)
    return sched, long, short


def _finish_order(sched: Scheduler) -> list[str]:
    order = []
    while sched.has_unfinished_requests():
        order += [o.request_id for o in run_step(sched) if o.finish_reason]
    return order


def test_continuous_batching_admits_a_short_request_into_the_running_batch_at_once() -> None:
    sched, long, short = _long_then_short("continuous")
    out = sched.schedule()
    assert [s.request for s in out.scheduled] == [long, short]
    sched.update_from_output(out, {long.request_id: 7, short.request_id: 7})
    assert _finish_order(sched) == [short.request_id, long.request_id]


def test_static_batching_holds_a_short_request_until_the_long_one_has_finished() -> None:
    sched, long, short = _long_then_short("static")
    while not long.is_finished:
        out = sched.schedule()
        assert [s.request for s in out.scheduled] == [long]
        assert short.status is RequestStatus.WAITING and short.num_computed_tokens == 0
        sched.update_from_output(out, {long.request_id: 7})
    out = sched.schedule()
    assert [s.request for s in out.scheduled] == [short] and out.admitted == [short]


def test_a_static_batch_is_the_waiting_line_and_keeps_its_slots_until_its_longest_request_ends() -> None:
    sched = make_scheduler(max_num_seqs=2, batching="static")
    short, long, later = (make_request(4, max_tokens=n, ignore_eos=True) for n in (1, 6, 1))
    for request in (short, long, later):
        sched.add_request(request)
    outputs = run_step(sched)
    assert [o.finish_reason for o in outputs] == ["length", None]  # `short` is done, its slot stays empty
    while not long.is_finished:
        assert later.status is RequestStatus.WAITING
        run_step(sched)
    assert sched.schedule().admitted == [later]


def test_aborting_a_static_batch_s_last_member_opens_the_next_batch() -> None:
    sched, long, short = _long_then_short("static")
    sched.finish_requests([long.request_id], RequestStatus.FINISHED_ABORTED)
    assert sched.schedule().admitted == [short]


def test_a_preempted_member_of_a_static_batch_runs_again_before_any_newcomer() -> None:
    sched = make_scheduler(num_blocks=4, block_size=4, max_num_seqs=2, max_model_len=16, batching="static")
    a, b = make_request(7, max_tokens=8, ignore_eos=True), make_request(7, max_tokens=8, ignore_eos=True)
    sched.add_request(a)
    sched.add_request(b)
    run_step(sched)
    newcomer = make_request(3, max_tokens=1)
    sched.add_request(newcomer)
    order = _finish_order(sched)
    assert sched.num_preemptions >= 1 and order[-1] == newcomer.request_id
