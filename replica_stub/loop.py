"""The engine loop: one asyncio task that steps scheduler and engine and feeds request streams.

Handlers `submit()` a request and await its `RequestStream`; they `abort()` it when their
client goes away, which frees its KV blocks at once. The loop sleeps on an event while there
is no work, so an idle replica costs nothing. `publish_events` (the KV-event publisher's flush)
runs after every step, before its outputs reach the streams.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from replica_stub.engine.base import Engine
from replica_stub.metrics import StubMetrics
from replica_stub.output import RequestStream
from replica_stub.request import Request, RequestStatus
from replica_stub.scheduler import RequestOutput, Scheduler, SchedulerOutput

log = structlog.get_logger("replica_stub.loop")
DISPATCH_SLICE = 64  # streams woken per event-loop iteration; bounds the latency one step adds


class EngineLoop:
    def __init__(
        self,
        scheduler: Scheduler,
        engine: Engine,
        metrics: StubMetrics,
        publish_events: Callable[[], None] | None = None,
    ) -> None:
        self.scheduler, self.engine, self.metrics = scheduler, engine, metrics
        self._publish_events = publish_events or (lambda: None)
        self._streams: dict[str, RequestStream] = {}
        self._wakeup = asyncio.Event()
        self.dead: BaseException | None = None
        # The step the engine computes now, scheduled but not yet applied to the scheduler (what a forecast
        # of the replica's state reads: `replica_stub.forecast_api`).
        self.step_in_flight: SchedulerOutput | None = None

    def submit(self, request: Request, stop: tuple[str, ...]) -> RequestStream:
        if self.dead is not None:
            raise RuntimeError("engine is dead")
        stream = RequestStream(request, self.engine.tokenizer, stop)
        self.scheduler.add_request(request)
        self._streams[request.request_id] = stream
        self._wakeup.set()
        return stream

    def abort(self, request_id: str) -> None:
        """Client gone: drop the request wherever it is and release its blocks."""
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return
        self.scheduler.finish_requests([request_id], RequestStatus.FINISHED_ABORTED)
        log.info("request_aborted", request_id=request_id, output_tokens=stream.num_output_tokens)

    def reset_prefix_cache(self) -> bool:
        """vLLM's /reset_prefix_cache; the AllBlocksCleared event goes out now, the loop may be idle."""
        done = self.scheduler.kv.pool.reset_prefix_cache()
        self._publish_events()
        return done

    async def run(self) -> None:
        try:
            while True:
                if not self.scheduler.has_unfinished_requests():
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                step = self.scheduler.schedule()
                now = time.monotonic()
                for request in step.admitted:
                    self.metrics.on_admitted(request, now)
                if not step.scheduled:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                self.step_in_flight = step
                sampled = await self.engine.execute(step)
                self.step_in_flight = None
                outputs = self.scheduler.update_from_output(step, sampled)
                self._publish_events()
                await self._dispatch(outputs)
        except Exception as exc:
            self.dead = exc
            log.exception("engine_dead")
            for stream in self._streams.values():
                stream.add_tokens([], "abort")
            self._streams.clear()
            raise

    async def _dispatch(self, outputs: list[RequestOutput]) -> None:
        """Hand new tokens to their streams, yielding to the event loop every DISPATCH_SLICE
        streams so a 1000-sequence step does not wake 1000 handlers in one loop iteration."""
        now = time.monotonic()
        for index, out in enumerate(outputs):
            if index and index % DISPATCH_SLICE == 0:
                await asyncio.sleep(0)
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            first = stream.first_token_time is None
            if stream.add_tokens(out.new_token_ids, out.finish_reason):
                self.scheduler.finish_requests([out.request_id], RequestStatus.FINISHED_STOPPED)
            request = stream.request
            if first:
                self.metrics.on_first_token(request, now)
            if stream.finish_reason is not None:
                del self._streams[out.request_id]
                self.metrics.on_finished(request, stream.finish_reason, now)
                log.info(
                    "request_finished",
                    request_id=request.request_id,
                    finish_reason=stream.finish_reason,
                    prompt_tokens=request.num_prompt_tokens,
                    cached_tokens=request.num_cached_tokens,
                    output_tokens=stream.num_output_tokens,
                    e2e_s=round(now - request.arrival_time, 4),
                )
        self.metrics.on_step(len(outputs))


async def probe_loop_lag(
    metrics: StubMetrics, scheduler: Scheduler, interval_s: float = 0.01, warn_s: float = 0.05
) -> None:
    """Measure how late the event loop wakes a sleeper: the latency every stream also suffers."""
    while True:
        start = time.perf_counter()
        await asyncio.sleep(interval_s)
        lag = max(0.0, time.perf_counter() - start - interval_s)
        metrics.on_loop_lag(lag)
        if lag > warn_s:
            log.warning(
                "event_loop_lag",
                lag_ms=round(lag * 1000, 1),
                running=scheduler.num_running,
                waiting=scheduler.num_waiting,
            )
