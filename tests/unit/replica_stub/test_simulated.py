from __future__ import annotations

import itertools
import time

from replica_stub.engine.simulated import SimEngine
from replica_stub.engine.timing import TimingModel
from replica_stub.request import Request, SamplingParams
from replica_stub.scheduler import SchedulerOutput
from tests.unit.replica_stub.factories import make_request, make_scheduler

_ids = itertools.count()


async def _generate(engine: SimEngine, request: Request, steps: int) -> list[int]:
    scheduler = make_scheduler(block_size=request.block_size)
    scheduler.add_request(request)
    for _ in range(steps):
        step = scheduler.schedule()
        scheduler.update_from_output(step, await engine.execute(step))
    return request.output_token_ids


def _request(seed: int | None, prompt: list[int], *, ignore_eos: bool = False) -> Request:
    sampling = SamplingParams(max_tokens=50, seed=seed, ignore_eos=ignore_eos)
    return Request(f"r{next(_ids)}", prompt, sampling, 4, eos_token_id=SimEngine(TimingModel()).tokenizer.eos_token_id)


async def test_text_is_deterministic_for_seed_and_prompt() -> None:
    engine = SimEngine(TimingModel(), speedup=1000, output_len=(100, 100))
    a = await _generate(engine, _request(1, [1, 2, 3]), 5)
    b = await _generate(engine, _request(1, [1, 2, 3]), 5)
    c = await _generate(engine, _request(2, [1, 2, 3]), 5)
    assert a == b != c


async def test_eos_at_the_natural_length_unless_ignored() -> None:
    engine = SimEngine(TimingModel(), speedup=1000, output_len=(3, 3))
    stopped = await _generate(engine, _request(1, [5, 6]), 5)
    assert stopped[-1] == engine.tokenizer.eos_token_id and len(stopped) == 3
    ignored = await _generate(engine, _request(1, [5, 6], ignore_eos=True), 5)
    assert engine.tokenizer.eos_token_id not in ignored and len(ignored) == 5


def test_step_cost_classifies_prefill_and_decode() -> None:
    engine = SimEngine(TimingModel())
    scheduler = make_scheduler()
    decoding, fresh = make_request(8, max_tokens=10), make_request(20)
    scheduler.add_request(decoding)
    scheduler.update_from_output(scheduler.schedule(), {decoding.request_id: 1})
    scheduler.add_request(fresh)
    step = scheduler.schedule()
    assert engine.step_ms(step) == TimingModel().step_ms([(20, 0)], [8])
    assert engine.step_ms(SchedulerOutput()) == 0


async def test_speedup_scales_the_sleep() -> None:
    engine = SimEngine(TimingModel(decode_base_ms=1000), speedup=100)
    scheduler = make_scheduler()
    request = make_request(4, max_tokens=5)
    scheduler.add_request(request)
    prefill = scheduler.schedule()
    scheduler.update_from_output(prefill, await engine.execute(prefill))
    start = time.perf_counter()
    await engine.execute(scheduler.schedule())  # one decode step: 1000 ms / 100
    assert 0.009 < time.perf_counter() - start < 0.1
