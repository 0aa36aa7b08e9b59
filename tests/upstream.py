"""A scriptable in-test upstream replica (aiohttp), for behaviours the real stub should not need.

Usage (same event loop):
    fake = FakeReplica("r1")
    server = TestServer(fake.app); await server.start_server()
Usage (a thread with its own loop, e.g. behind a gateway subprocess):
    with ThreadServer(FakeReplica("r1", hold=threading.Event()).app) as url: ...

Knobs: `status` (answer code), `chunks` (stream length), `hold` (a threading.Event awaited before
every chunk after the first: proves the gateway does not buffer), `stall_s` (sleep before headers),
`partial` (half a body, then stall or close), `die_after` (a stream's connection drops after that many
chunks; with `mid_event` after half of one more event; with `bad_chunk` an invalid chunk-size line is sent
instead and the connection kept open), `chunk_pad` (bigger chunks), `poison` (a marker: a request whose
body holds it gets `poison_mode`: "reset" drops the connection without answering, "stall" sends nothing
for 30 s), `usage` (the usage object of whole answers and of a stream's last event, in place of the
honest one), `answer_bytes` (a whole answer's content padded to about that many bytes), `drip_s` (a whole
answer's body sent in `drip_pieces` pieces, this long apart: slow but moving; `chunked` sends it so
with no Content-Length), `models` (model id: its
`max_model_len`, listed in `GET /v1/models`), `healthy` (for /health), `metrics_text`. Every request's
headers and body are kept in `seen`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict


@dataclass
class Seen:
    path: str
    headers: CIMultiDict[str]
    body: bytes


@dataclass
class FakeReplica:
    replica_id: str
    status: int = 200
    chunks: int = 3
    hold: threading.Event | None = None
    stall_s: float = 0.0
    healthy: bool = True
    partial: str | None = None  # "stall" or "close": send headers and half a JSON body, then do that
    die_after: int | None = None  # streams: close the connection after this many chunks
    mid_event: bool = False  # with die_after: half an event goes out before the connection drops
    mid_event_pad: int = 0  # that half event's extra bytes (an event too large for the gateway to hold)
    bad_chunk: bool = False  # with die_after: an invalid chunk-size line instead of the drop, then silence
    chunk_pad: int = 0  # streams: extra characters in every chunk's content
    poison: str = ""  # a request whose body holds this marker gets `poison_mode`
    poison_mode: str = "reset"  # "reset": the connection drops without an answer; "stall": 30 s of silence
    headers: dict[str, str] = field(default_factory=dict)  # more response headers on whole answers
    usage: dict[str, Any] | None = None  # replaces the honest usage (a replica that lies about its counts)
    answer_bytes: int = 0  # whole answers: content padded to about this many bytes
    drip_s: float = 0.0  # whole answers: the body goes out in `drip_pieces` pieces this far apart
    drip_pieces: int = 10
    chunked: bool = False  # whole answers: chunked transfer encoding, no Content-Length, in `drip_pieces`
    models: dict[str, int] = field(default_factory=dict)  # GET /v1/models: id -> max_model_len
    metrics_text: str = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n"
    seen: list[Seen] = field(default_factory=list)
    gets: Counter[str] = field(default_factory=Counter)  # GET /health, /metrics, /v1/models: how many came
    cancelled: int = 0  # requests whose handler was cancelled (client gone)
    active: int = 0

    @property
    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/embeddings", self._complete)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        self.gets[request.path] += 1
        cards = [{"id": model, "object": "model", "max_model_len": n} for model, n in self.models.items()]
        return web.json_response({"object": "list", "data": cards})

    async def _health(self, request: web.Request) -> web.Response:
        self.gets[request.path] += 1
        return web.Response(status=200 if self.healthy else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        self.gets[request.path] += 1
        return web.Response(text=self.metrics_text)

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.seen.append(Seen(request.path, CIMultiDict(request.headers), raw))
        self.active += 1
        try:
            if self.poison and self.poison.encode() in raw:
                return await self._poisoned(request)
            if self.stall_s:
                await asyncio.sleep(self.stall_s)
            if self.status != 200:
                body = orjson.dumps({"error": {"message": "boom", "type": "InternalServerError", "code": self.status}})
                return web.Response(status=self.status, body=body, content_type="application/json")
            body = orjson.loads(raw)
            if self.partial is not None:
                return await self._partial(request)
            if body.get("stream"):
                return await self._stream(request, body)
            answer = orjson.dumps(self._whole(body))
            if self.drip_s or self.chunked:
                return await self._drip(request, answer)
            return web.Response(
                body=answer,
                content_type="application/json",
                headers={"X-Replica-Id": self.replica_id, "X-Custom": "kept", **self.headers},
            )
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1

    def _whole(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = _completion(self.replica_id, body, 0)
        if self.answer_bytes:
            answer["choices"][0]["message"]["content"] = "x" * self.answer_bytes
        if self.usage is not None:
            answer["usage"] = self.usage
        return answer

    async def _drip(self, request: web.Request, answer: bytes) -> web.StreamResponse:
        """A whole answer in pieces: slow but never silent for long, or without a Content-Length."""
        length = {} if self.chunked else {"Content-Length": str(len(answer))}
        response = web.StreamResponse(headers={"Content-Type": "application/json", **length, **self.headers})
        if self.chunked:
            response.enable_chunked_encoding()
        await response.prepare(request)
        step = -(-len(answer) // self.drip_pieces)
        for start in range(0, len(answer), step):
            await response.write(answer[start : start + step])
            if start + step < len(answer) and self.drip_s:
                await asyncio.sleep(self.drip_s)
        return response

    async def _poisoned(self, request: web.Request) -> web.StreamResponse:
        if self.poison_mode == "stall":
            await asyncio.sleep(30)
        assert request.transport is not None
        request.transport.abort()  # no answer at all: the client reads a dropped connection
        return web.Response()

    async def _partial(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "100"})
        await response.prepare(request)
        await response.write(b'{"id": "half')
        if self.partial == "stall":
            await asyncio.sleep(30)
        assert request.transport is not None
        request.transport.close()
        return response

    async def _stream(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Replica-Id": self.replica_id})
        await response.prepare(request)
        for i in range(self.chunks):
            if i == self.die_after:
                assert request.transport is not None
                if self.bad_chunk:
                    await asyncio.sleep(0.05)  # the client has read the head and the first event by now
                    request.transport.write(b"zz\r\n")  # not a hex chunk size: the client's parser fails
                    await asyncio.sleep(30)
                if self.mid_event:
                    await response.write(
                        b'data: {"id": "c1", "choices": [{"index": 0, "delta": {"cont' + b"x" * self.mid_event_pad
                    )
                request.transport.close()
                return response
            if i and self.hold is not None:
                await asyncio.get_running_loop().run_in_executor(None, self.hold.wait, 10)
                self.hold.clear()
            chunk = {
                "id": "c1",
                "object": "chat.completion.chunk",
                "model": body.get("model"),
                "choices": [
                    {"index": 0, "delta": {"content": f"tok{i} " + "x" * self.chunk_pad}, "finish_reason": None}
                ],
                "usage": None,
            }
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        final = _completion(self.replica_id, body, 2)
        final["choices"] = []
        if self.usage is not None:
            final["usage"] = self.usage
        await response.write(b"data: " + orjson.dumps(final) + b"\n\ndata: [DONE]\n\n")
        return response


def _completion(replica_id: str, body: dict[str, Any], cached: int) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "model": body.get("model"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"hello from {replica_id}"},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 7,
            "completion_tokens": 3,
            "total_tokens": 10,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


class ThreadServer:
    """Serve an aiohttp app on a loopback port from a background thread (its own event loop)."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        runner = web.AppRunner(self.app, handler_cancellation=True)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        self._loop.run_until_complete(self._loop.shutdown_default_executor())
        self._loop.close()

    def __enter__(self) -> str:
        self._thread.start()
        self._ready.wait(10)
        return self.url

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


async def until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll a condition on the running loop (state changed by background tasks), failing after a timeout."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def serve_fakes(fakes: tuple[FakeReplica, ...], servers: list[TestServer]) -> list[str]:
    """Start each fake on a test server (appended to `servers`, for the caller to close); their base URLs."""
    urls = []
    for fake in fakes:
        server = TestServer(fake.app)
        await server.start_server()
        servers.append(server)
        urls.append(str(server.make_url("")).rstrip("/"))
    return urls
