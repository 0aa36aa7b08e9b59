"""A feature hears of every request by registering an observer on a built app: nothing in
gateway/serving is edited for it. Each hook reaches only the observers that define it."""

from __future__ import annotations

import asyncio
import contextvars

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gateway.config.loader import parse_config
from gateway.request.exchange import Exchange, FinishedRequest
from gateway.request.observers import Observers, RequestObserver
from gateway.serving.app import make_app
from gateway.serving.app_keys import OBSERVERS
from tests.upstream import FakeReplica, serve_fakes

pytestmark = pytest.mark.timeout(30)


class Recorder(RequestObserver):
    def __init__(self) -> None:
        self.first_bytes: list[tuple[str, float | None]] = []
        self.retries: list[tuple[str, str]] = []
        self.done: list[FinishedRequest] = []

    def first_byte(self, exchange: Exchange, replica_id: str) -> None:
        self.first_bytes.append((replica_id, exchange.ttft_s))

    def attempt_failed(self, exchange: Exchange, replica_id: str, kind: str, error: str) -> None:
        self.retries.append((replica_id, kind))

    def finished(self, done: FinishedRequest) -> None:
        self.done.append(done)


async def test_an_observer_registered_on_the_app_hears_first_byte_retries_and_the_finished_record() -> None:
    servers: list[TestServer] = []
    urls = await serve_fakes((FakeReplica("r0", status=503), FakeReplica("r1")), servers)
    app = make_app(
        parse_config(
            {
                "pools": {
                    "m1": {
                        "replicas": [{"url": url, "name": f"r{i}"} for i, url in enumerate(urls)],
                        "routing": {"policy": "round_robin"},
                    }
                }
            }
        )
    )
    recorder = Recorder()
    app[OBSERVERS].add(recorder)
    gateway = TestServer(app)
    await gateway.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(2):  # round robin: one of the two starts on r0, which answers 503
                async with session.post(
                    gateway.make_url("/v1/chat/completions"),
                    json={"model": "m1", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
                ) as resp:
                    assert resp.status == 200
                    await resp.read()
    finally:
        await gateway.close()
        for server in servers:
            await server.close()
    assert recorder.retries == [("r0", "http_503")]
    assert [replica for replica, _ in recorder.first_bytes] == ["r1", "r1"]
    assert all(ttft is not None and ttft > 0 for _, ttft in recorder.first_bytes)
    assert [(d.replica_id, d.status, d.model, d.failed_replicas) for d in recorder.done] in (
        [("r1", 200, "m1", ("r0",)), ("r1", 200, "m1", ())],
        [("r1", 200, "m1", ()), ("r1", 200, "m1", ("r0",))],
    )
    for done in recorder.done:
        assert done.ok and done.streamed and done.decision is not None and done.decision.replica_id == "r1"
        assert done.timing.ttft_s is not None and done.timing.total_s >= done.timing.ttft_s


def test_a_hook_reaches_only_the_observers_that_define_it() -> None:
    class OnlyFinished:
        def __init__(self) -> None:
            self.calls = 0

        def finished(self, done: FinishedRequest) -> None:
            self.calls += 1

    class Inherits(RequestObserver):  # defines nothing: registered for no hook
        pass

    observers, only = Observers(), OnlyFinished()
    observers.add(only)
    observers.add(Inherits())
    assert (len(observers._first_byte), len(observers._attempt_failed), len(observers._finished)) == (0, 0, 1)
    observers.finished(None)  # type: ignore[arg-type]
    assert only.calls == 1


class Calls:
    """Observers that record the order their `finished` hooks ran in, and the request's context then."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object, object]] = []

    def observer(self, name: str, fails_on: object = None) -> RequestObserver:
        calls = self.calls

        class Named(RequestObserver):
            def finished(self, done: FinishedRequest) -> None:
                calls.append((name, done, _REQUEST.get(None)))
                if done == fails_on:
                    raise RuntimeError("one odd request")

        return Named()


_REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("request")


async def test_batched_hooks_run_once_the_loop_turns_one_hook_over_the_batch_in_each_requests_context() -> None:
    recorded, observers = Calls(), Observers()
    observers.add(recorded.observer("router"))
    observers.add(recorded.observer("metrics"), batched=True)
    observers.add(recorded.observer("log", fails_on="a"), batched=True)
    for request in ("a", "b"):
        token = _REQUEST.set(f"context of {request}")
        observers.finished(request)  # type: ignore[arg-type]
        _REQUEST.reset(token)
    assert recorded.calls == [("router", "a", "context of a"), ("router", "b", "context of b")]  # at once
    await asyncio.sleep(0)  # one turn of the loop
    assert recorded.calls[2:] == [
        ("metrics", "a", "context of a"),
        ("metrics", "b", "context of b"),
        ("log", "a", "context of a"),  # failed: logged, and the batch goes on
        ("log", "b", "context of b"),
    ]
    observers.finished("c")  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert [(name, done) for name, done, _ in recorded.calls[6:]] == [("router", "c"), ("metrics", "c"), ("log", "c")]


def test_without_a_running_loop_the_batched_hooks_run_at_once_after_the_others() -> None:
    recorded, observers = Calls(), Observers()
    observers.add(recorded.observer("log"), batched=True)
    observers.add(recorded.observer("router"))
    observers.finished("a")  # type: ignore[arg-type]
    assert [name for name, _, _ in recorded.calls] == ["router", "log"]
