"""Drive a workload against any OpenAI-compatible URL and summarise what clients saw.

Each session runs its turns in order over streaming chat completions; the answer the server
streamed back becomes part of the next turn's history. Per request we record TTFT (first
content byte), end-to-end time, usage (prompt and cached tokens) and the replica that served it.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from gateway.workloads import Session


@dataclass(slots=True)
class Result:
    session_id: str
    turn: int
    ok: bool
    status: int = 0
    ttft_s: float | None = None
    e2e_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    replica: str = ""
    error: str = ""


@dataclass(slots=True)
class Summary:
    requests: int
    errors: int
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    e2e_p50_s: float
    cached_ratio: float  # sum of cached prompt tokens / sum of prompt tokens
    replica_share: dict[str, int] = field(default_factory=dict)

    @property
    def busiest_over_mean(self) -> float:
        counts = list(self.replica_share.values())
        return max(counts) / statistics.fmean(counts) if counts else 0.0


async def run(base_url: str, model: str, sessions: list[Session], *, timeout_s: float = 120.0) -> list[Result]:
    """Run every session (concurrently, each at its start time) and return one Result per request."""
    results: list[Result] = []
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:
        t0 = time.monotonic()
        await asyncio.gather(*(_run_session(http, base_url, model, s, t0, results) for s in sessions))
    return results


async def _run_session(http: aiohttp.ClientSession, base_url: str, model: str, session: Session,
                       t0: float, results: list[Result]) -> None:
    await asyncio.sleep(max(0.0, session.start_s - (time.monotonic() - t0)))
    messages: list[dict[str, str]] = [{"role": "system", "content": session.system}]
    for turn, user_text in enumerate(session.user_turns):
        if turn and session.think_s:
            await asyncio.sleep(session.think_s)
        messages.append({"role": "user", "content": user_text})
        result, answer = await _chat(http, base_url, model, messages, session, turn)
        results.append(result)
        if not result.ok:
            return
        messages.append({"role": "assistant", "content": answer})


async def _chat(http: aiohttp.ClientSession, base_url: str, model: str, messages: list[dict[str, str]],
                session: Session, turn: int) -> tuple[Result, str]:
    body = {"model": model, "messages": messages, "max_tokens": session.max_tokens, "stream": True,
            "temperature": 0, "stream_options": {"include_usage": True}}
    result = Result(session.session_id, turn, ok=False)
    parts: list[str] = []
    start = time.monotonic()
    try:
        async with http.post(f"{base_url}/v1/chat/completions", data=orjson.dumps(body),
                             headers={"Content-Type": "application/json", "X-Session-ID": session.session_id}) as resp:
            result.status = resp.status
            result.replica = resp.headers.get("X-Replica-Id", "")
            if resp.status != 200:
                result.error = (await resp.text())[:200]
                return result, ""
            buffer = b""
            async for chunk in resp.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    _consume(line, result, parts, start)
            result.ok = True
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        result.error = repr(exc)
    result.e2e_s = time.monotonic() - start
    return result, "".join(parts)


def _consume(line: bytes, result: Result, parts: list[str], start: float) -> None:
    if not line.startswith(b"data: ") or line == b"data: [DONE]":
        return
    chunk: dict[str, Any] = orjson.loads(line[6:])
    for choice in chunk.get("choices") or ():
        text = (choice.get("delta") or {}).get("content")
        if text:
            if result.ttft_s is None:
                result.ttft_s = time.monotonic() - start
            parts.append(text)
    usage = chunk.get("usage")
    if usage:
        result.prompt_tokens = usage.get("prompt_tokens", 0)
        result.completion_tokens = usage.get("completion_tokens", 0)
        result.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def summarise(results: list[Result]) -> Summary:
    ok = [r for r in results if r.ok]
    ttfts = sorted(r.ttft_s for r in ok if r.ttft_s is not None) or [0.0]
    e2es = sorted(r.e2e_s for r in ok) or [0.0]
    prompt = sum(r.prompt_tokens for r in ok)
    return Summary(
        requests=len(results),
        errors=len(results) - len(ok),
        ttft_p50_s=_quantile(ttfts, 0.50),
        ttft_p90_s=_quantile(ttfts, 0.90),
        ttft_p99_s=_quantile(ttfts, 0.99),
        e2e_p50_s=_quantile(e2es, 0.50),
        cached_ratio=sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
        replica_share=dict(Counter(r.replica for r in ok)),
    )


def _quantile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]
