"""Fault-injection tools for the reliability suite: concurrent clients, the replica's own running
count, a private Redis that can be killed and restarted on its port, gateway restarts."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
import redis

from gateway.replicas.load import parse_metrics
from tests.helpers import Proc, free_port, python_module, redis_server_binary, wait_http
from tests.integration.gateway_procs import MODEL, Gateway, Stub

DONE = b"data: [DONE]\n\n"


def eventually(check: Callable[[], bool], timeout_s: float = 10.0, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(interval_s)


def replica_running(stub: Stub, http: httpx.Client | None = None) -> int:
    """The replica's own count of requests in its batch (vllm:num_requests_running)."""
    text = (http.get(f"{stub.url}/metrics") if http else httpx.get(f"{stub.url}/metrics", timeout=5)).text
    return parse_metrics(text).running


def metric(gateway: Gateway, line_start: str) -> float | None:
    """The value of the first /metrics sample line starting with `line_start`."""
    for line in httpx.get(f"{gateway.url}/metrics", timeout=5).text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


@dataclass
class Outcome:
    """One client request as the client saw it."""

    status: int = 0
    replica: str = ""
    body: bytes = b""
    error: str = ""  # transport error or timeout (a hang)
    first_byte_s: float | None = None
    took_s: float | None = None  # to the end of the answer (None: no complete answer)

    @property
    def clean(self) -> bool:
        """A complete, well-formed answer: a JSON body, or a stream ending in [DONE]."""
        return self.status == 200 and not self.error and (self.body.endswith(DONE) or self.body.startswith(b"{"))

    @property
    def stream_error_event(self) -> bool:
        return b'"type":"BadGatewayError"' in self.body and self.body.endswith(DONE)


@dataclass
class Load:
    """Many concurrent requests from one asyncio client; each keeps its own outcome."""

    url: str
    timeout_s: float = 30.0
    outcomes: list[Outcome] = field(default_factory=list)

    async def one(
        self,
        session: aiohttp.ClientSession,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
        path: str = "/v1/chat/completions",
    ) -> Outcome:
        out = Outcome()
        self.outcomes.append(out)
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout_s):
                async with session.post(self.url + path, json=body, headers=headers) as resp:
                    out.status, out.replica = resp.status, resp.headers.get("X-Replica-Id", "")
                    async for chunk in resp.content.iter_any():
                        if out.first_byte_s is None:
                            out.first_byte_s = time.monotonic() - started
                        out.body += chunk
            out.took_s = time.monotonic() - started
        except TimeoutError:
            out.error = "hung"
        except aiohttp.ClientError as exc:
            out.error = f"{type(exc).__name__}: {exc}"
        return out


def post_until(
    url: str,
    stop: threading.Event,
    outcomes: list[Outcome],
    body: Callable[[int], dict[str, Any]],
) -> None:
    """One client posting `body(i)` for i = 1, 2, ... back to back until `stop`, on one keep-alive
    connection and without retries (every failure counts); each request's outcome is appended."""
    with httpx.Client(base_url=url, timeout=30) as http:
        i = 0
        while not stop.is_set():
            i += 1
            out = Outcome()
            try:
                with http.stream("POST", "/v1/chat/completions", json=body(i)) as resp:
                    out.status, out.body = resp.status_code, resp.read()
            except httpx.HTTPError as exc:
                out.error = f"{type(exc).__name__}: {exc}"
            outcomes.append(out)


async def streaming(
    load: Load, session: aiohttp.ClientSession, n: int, max_tokens: int, label: str = "story"
) -> list[asyncio.Task[Outcome]]:
    """Start n streams and return once every one has its first byte."""
    tasks = [
        asyncio.create_task(load.one(session, chat(f"{label} {i}", max_tokens=max_tokens, stream=True)))
        for i in range(n)
    ]
    while sum(o.first_byte_s is not None for o in load.outcomes) < n:
        await asyncio.sleep(0.02)
    return tasks


def report(name: str, outcomes: list[Outcome], **extra: Any) -> None:
    """One line of figures for docs/RELIABILITY.md (visible with `pytest -s`)."""
    failed = sum(1 for o in outcomes if o.status >= 500 or (o.error and o.error != "hung"))
    hung = sum(1 for o in outcomes if o.error == "hung")
    lost = sum(1 for o in outcomes if not o.error and o.status == 200 and not o.clean)
    figures = " ".join(
        f"{k}={v}" for k, v in {"sent": len(outcomes), "failed": failed, "hung": hung, "lost": lost, **extra}.items()
    )
    print(f"\nRELIABILITY {name}: {figures}")


def chat(content: str = "hello", max_tokens: int = 8, stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
        **extra,
    }


class RedisServer:
    """A redis-server of this test only, on a fixed port so it can come back where it was."""

    def __init__(self) -> None:
        binary = redis_server_binary()
        assert binary is not None, "redis-server not installed"
        self.binary, self.port = binary, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: Proc | None = None

    def start(self) -> RedisServer:
        self.proc = Proc(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        )
        client = redis.Redis(port=self.port)
        eventually(lambda: _pings(client), timeout_s=10)
        client.close()
        return self

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()

    def pause(self, paused: bool) -> None:
        assert self.proc is not None
        self.proc.popen.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.popen.send_signal(signal.SIGCONT)
            self.proc.stop()


def steady_clients(
    session: aiohttp.ClientSession, load: Load, clients: int, stop: asyncio.Event
) -> list[asyncio.Task[None]]:
    """`clients` innocent clients beside a test's bad traffic: each sends a chat turn every 50 ms (every other
    one streamed) into `load` until `stop` is set."""

    async def steady(client: int) -> None:
        n = 0
        while not stop.is_set():
            await load.one(session, chat(f"client {client} turn {n}", stream=n % 2 == 0))
            n += 1
            await asyncio.sleep(0.05)

    return [asyncio.create_task(steady(c)) for c in range(clients)]


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def restart_gateway(gateway: Gateway) -> None:
    """SIGTERM, wait for the exit (the drain), then serve the same config on the same port again."""
    gateway.proc.stop(signal.SIGTERM, timeout=30)
    assert gateway.proc.popen.returncode == 0, gateway.proc.output()[-3000:]
    gateway.proc = Proc(python_module("gateway", "serve", "--config", str(gateway.config_path)))
    wait_http(f"{gateway.url}/ready", gateway.proc)
