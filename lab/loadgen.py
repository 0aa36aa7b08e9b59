"""Drive a workload against any OpenAI-compatible URL and record what clients saw.

Each session runs its turns in order over streaming chat completions; the answer the server
streamed back becomes part of the next turn's history. Per request we record when it was due and
when it was sent (client lag), TTFT (first content byte), the gaps between later chunks (ITL),
end-to-end time, usage (prompt and cached tokens) and the replica that served it (`X-Replica-Id`).

Two arrival modes: by the workload's session start times (open loop, `concurrency=0`), or
`concurrency` sessions at a time back to back (closed loop, start times ignored).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from lab.results import Result, Summary, summarise
from lab.workloads import Session

OnResult = Callable[[Result], None]


async def run(
    base_url: str,
    model: str,
    sessions: list[Session],
    *,
    concurrency: int = 0,
    timeout_s: float = 120.0,
    ignore_eos: bool = True,
    on_result: OnResult | None = None,
) -> list[Result]:
    """Run every session and return one Result per request (in completion order).

    `ignore_eos` asks the server (a vLLM extension) to produce exactly `max_tokens`, so every
    policy is compared on the same amount of work; turn it off for servers that reject it."""
    results: list[Result] = []

    def record(result: Result) -> None:
        results.append(result)
        if on_result is not None:
            on_result(result)

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:
        client = _Client(http, base_url.rstrip("/"), model, ignore_eos, time.monotonic(), record)
        if concurrency > 0:
            queue = list(reversed(sessions))

            async def worker() -> None:
                while queue:
                    await client.session(queue.pop(), None)

            await asyncio.gather(*(worker() for _ in range(min(concurrency, len(sessions)))))
        else:
            await asyncio.gather(*(client.session(s, s.start_s) for s in sessions))
    return results


class _Client:
    def __init__(
        self, http: aiohttp.ClientSession, base_url: str, model: str, ignore_eos: bool, t0: float, record: OnResult
    ) -> None:
        self.http, self.base_url, self.model, self.ignore_eos = http, base_url, model, ignore_eos
        self.t0, self.record = t0, record

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def session(self, session: Session, start_s: float | None) -> None:
        """`start_s` None: start now (closed loop)."""
        due = self.now() if start_s is None else start_s
        await asyncio.sleep(max(0.0, due - self.now()))
        messages: list[dict[str, str]] = [{"role": "system", "content": session.system}] if session.system else []
        for turn, user_text in enumerate(session.user_turns):
            if turn:
                due = self.now() + session.think_s
                await asyncio.sleep(session.think_s)
            messages.append({"role": "user", "content": user_text})
            result, answer = await self.chat(messages, session, turn, due)
            self.record(result)
            if not result.ok:
                return
            messages.append({"role": "assistant", "content": answer})

    async def chat(self, messages: list[dict[str, str]], session: Session, turn: int, due: float) -> tuple[Result, str]:
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": session.max_tokens,
            "stream": True,
            "temperature": 0,
            "stream_options": {"include_usage": True},
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
        result = Result(session.session_id, turn, ok=False, scheduled_s=due, sent_s=self.now())
        parts: list[str] = []
        start = time.monotonic()
        try:
            async with self.http.post(
                f"{self.base_url}/v1/chat/completions",
                data=orjson.dumps(body),
                headers={"Content-Type": "application/json", "X-Session-ID": session.session_id},
            ) as resp:
                result.status = resp.status
                result.replica = resp.headers.get("X-Replica-Id", "")
                if resp.status != 200:
                    result.error = (await resp.text())[:200]
                    return result, ""
                buffer, last = b"", 0.0
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        last = _consume(line, result, parts, start, last)
                result.ok = True
        except (TimeoutError, aiohttp.ClientError) as exc:
            result.error = repr(exc)
        result.e2e_s = time.monotonic() - start
        return result, "".join(parts)


def _consume(line: bytes, result: Result, parts: list[str], start: float, last: float) -> float:
    """Fold one SSE line into `result`; returns the time of the latest content chunk."""
    if not line.startswith(b"data: ") or line == b"data: [DONE]":
        return last
    chunk: dict[str, Any] = orjson.loads(line[6:])
    for choice in chunk.get("choices") or ():
        text = (choice.get("delta") or {}).get("content")
        if text:
            now = time.monotonic()
            if result.ttft_s is None:
                result.ttft_s = now - start
            else:
                result.itl_s.append(now - last)
            last = now
            parts.append(text)
    usage = chunk.get("usage")
    if usage:
        result.prompt_tokens = usage.get("prompt_tokens", 0)
        result.completion_tokens = usage.get("completion_tokens", 0)
        result.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return last


__all__ = ["Result", "Summary", "run", "summarise"]
