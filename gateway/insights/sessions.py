"""Agent-session timelines: an agent making n hops is n requests, each paying its own queue, prefill
and TTFT; this keeps each session's hops in order so that the sum can be seen.

A generation request's session is its `view.session_key` (the `headers.session` header,
`prompt_cache_key` or `user`), within its tenant: with auth on the id is `<tenant>:<key>`, so two
tenants' "alice" stay apart; without one (and `sessions.infer`), the session whose latest prompt this one extends: its
chain of prefix hashes holds that prompt's last block (a growing agent transcript does). Only the
last `_SCAN_BLOCKS` blocks are looked up, and a prompt that ends inside its shared preamble (system
prompt, tools) starts no chain, so conversations sharing a system prompt are not merged.

Memory is bounded: an LRU of `sessions.max_sessions` sessions, each with its last
`sessions.max_requests` hops (its totals count every hop). Recording a hop is O(1): a few dict and
deque operations, no I/O. A session idle for `sessions.idle_s` (or evicted) has ended: its hop count
and summed TTFT go to the histograms `affinity_gateway_session_hops` and
`affinity_gateway_session_ttft_seconds`, from a sweep off the request path; a request after a
session's end starts it over. Sizes are read at start.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram

from gateway.config.features import SessionsConfig
from gateway.request.exchange import FinishedRequest
from gateway.request.observers import RequestObserver
from gateway.request.timing import Timing, rounded
from gateway.request.usage import Usage
from gateway.support.background import background
from gateway.view import RequestView

GENERATION = frozenset({"chat", "completions", "messages", "responses"})  # an agent's hops; not /tokenize etc.
_SCAN_BLOCKS = 256  # how far back in a prompt's chain the previous prompt's end is looked for
_HOPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128)
_SESSION_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


@dataclass(slots=True)
class Hop:
    request_id: str
    at: float  # wall clock at the request's end
    model: str
    replica: str | None
    status: int
    timing: Timing
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None

    def to_json(self) -> dict[str, Any]:
        t = self.timing
        uncached = (
            None
            if self.prompt_tokens is None
            else self.prompt_tokens - min(self.cached_tokens or 0, self.prompt_tokens)
        )
        return {
            "request_id": self.request_id,
            "at": round(self.at, 3),
            "model": self.model,
            "replica": self.replica,
            "status": self.status,
            "queue_s": rounded(t.queue_s),
            "ttft_s": rounded(t.ttft_s),
            "prefill_s": rounded(t.prefill_s),
            "decode_s": rounded(t.decode_s),
            "total_s": rounded(t.total_s),
            "tokens_per_s": rounded(t.tokens_per_s),
            "itl_s": rounded(t.itl_s),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "uncached_prefill_tokens": uncached,
            "completion_tokens": self.completion_tokens,
        }


@dataclass(slots=True)
class Session:
    session_id: str
    source: str  # "header", "prompt_cache_key", "user" (its first request's), or "inferred" (a growing prefix chain)
    tenant: str | None
    hops: deque[Hop]
    started: float = field(default_factory=time.time)
    last: float = 0.0  # monotonic time of its latest hop
    count: int = 0
    ttft_s: float = 0.0
    queue_s: float = 0.0
    prefill_s: float = 0.0
    streamed_s: float = 0.0  # time to complete of the hops whose prefill is known (streams): prefill's share
    total_s: float = 0.0
    chain_end: int | None = None  # the last block hash of its latest prompt (inferred sessions follow it)
    ended: bool = False

    def add(self, hop: Hop) -> None:
        self.hops.append(hop)
        self.count += 1
        t = hop.timing
        self.ttft_s += t.ttft_s or 0.0
        self.queue_s += t.queue_s
        if t.prefill_s is not None:
            self.prefill_s += t.prefill_s
            self.streamed_s += t.total_s
        self.total_s += t.total_s

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.session_id,
            "source": self.source,
            "tenant": self.tenant,
            "started": round(self.started, 3),
            "updated": round(self.hops[-1].at, 3) if self.hops else None,
            "ended": self.ended,
            "hops": self.count,
            "ttft_s": rounded(self.ttft_s),
            "queue_s": rounded(self.queue_s),
            "prefill_s": rounded(self.prefill_s),
            "total_s": rounded(self.total_s),
            "prefill_share": round(self.prefill_s / self.streamed_s, 4) if self.streamed_s > 0 else None,
        }


class Sessions(RequestObserver):
    """Every session's timeline, from the requests that reached a replica."""

    def __init__(self, config: SessionsConfig, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently active first
        self._open: OrderedDict[str, None] = OrderedDict()  # not ended yet, same order
        self._ends: dict[int, str] = {}  # chain end → inferred session id
        self._serial = 0  # tells apart inferred sessions whose first requests had the same id
        self._hops: Histogram | None = None
        self._ttft: Histogram | None = None
        if registry is not None:
            self._hops = Histogram(
                "affinity_gateway_session_hops",
                "Requests per agent session, at its end (idle for sessions.idle_s, or evicted)",
                buckets=_HOPS,
                registry=registry,
            )
            self._ttft = Histogram(
                "affinity_gateway_session_ttft_seconds",
                "Summed TTFT of an agent session's requests, at its end",
                buckets=_SESSION_S,
                registry=registry,
            )

    @classmethod
    def attach(cls, app: web.Application, config: SessionsConfig, registry: CollectorRegistry) -> Sessions:
        sessions = cls(config, registry)
        app.cleanup_ctx.append(background("sessions-sweep", sessions._sweep_loop))
        return sessions

    def finished(self, done: FinishedRequest) -> None:
        if done.replica_id is not None:
            self.record(done.view, done.model, done.replica_id, done.status, done.usage, done.timing)

    def record(
        self, view: RequestView, model: str, replica: str | None, status: int, usage: Usage, timing: Timing
    ) -> None:
        """One finished request, from `gateway.serving.app._finished`."""
        if not self.config.enabled or view.endpoint not in GENERATION:
            return
        session = self._session_of(view)
        if session is None:
            return
        session.add(
            Hop(
                view.request_id,
                time.time(),
                model,
                replica,
                status,
                timing,
                usage.prompt_tokens,
                usage.cached_tokens,
                usage.completion_tokens,
            )
        )
        session.last = time.monotonic()
        self._sessions.move_to_end(session.session_id)
        self._open[session.session_id] = None
        self._open.move_to_end(session.session_id)
        if session.source == "inferred":
            self._follow(session, view)
        while len(self._sessions) > self.config.max_sessions:
            _, evicted = self._sessions.popitem(last=False)
            self._end(evicted)
            if evicted.chain_end is not None and self._ends.get(evicted.chain_end) == evicted.session_id:
                del self._ends[evicted.chain_end]

    def get(self, session_id: str) -> dict[str, Any] | None:
        session = self._sessions.get(session_id)
        if session is None:
            return None
        return {**session.summary(), "requests": [hop.to_json() for hop in session.hops]}

    def recent(self, limit: int) -> list[dict[str, Any]]:
        """The most recently active sessions first."""
        out: list[dict[str, Any]] = []
        for session in reversed(self._sessions.values()):
            if len(out) >= limit:
                break
            out.append(session.summary())
        return out

    def sweep(self, now: float) -> None:
        """End the sessions idle for `idle_s` (oldest first; stops at the first one still active)."""
        cutoff = now - self.config.idle_s
        while self._open:
            session_id = next(iter(self._open))
            session = self._sessions.get(session_id)
            if session is not None and session.last > cutoff:
                return
            del self._open[session_id]
            if session is not None:
                self._end(session)

    def _session_of(self, view: RequestView) -> Session | None:
        if view.session_key:
            session_id = view.session_key if view.tenant is None else f"{view.tenant}:{view.session_key}"
            session = self._sessions.get(session_id)
            if session is None or session.ended:
                session = self._new(session_id, view.session_source or "header", view.tenant)
            return session
        if not self.config.infer or not view.block_hashes:
            return None
        blocks = view.block_hashes
        for i in range(len(blocks) - 1, max(len(blocks) - 1 - _SCAN_BLOCKS, -1), -1):
            ending = self._ends.get(blocks[i])
            if (
                ending is not None
                and (session := self._sessions.get(ending)) is not None
                and not session.ended
                and session.tenant == view.tenant
            ):
                return session
        session_id = f"inferred-{view.request_id}"
        if (same := self._sessions.get(session_id)) is not None and not same.ended:  # a client's repeated id
            self._serial += 1
            session_id = f"{session_id}-{self._serial}"
        return self._new(session_id, "inferred", view.tenant)

    def _new(self, session_id: str, source: str, tenant: str | None) -> Session:
        """A new session (one after its namesake's idle end starts over: that one was observed)."""
        hops: deque[Hop] = deque(maxlen=self.config.max_requests)
        session = self._sessions[session_id] = Session(session_id, source, tenant, hops)
        return session

    def _follow(self, session: Session, view: RequestView) -> None:
        """The session's chain now ends at this prompt's last block, unless that is still the preamble."""
        if session.chain_end is not None:
            self._ends.pop(session.chain_end, None)
        session.chain_end = None
        blocks = view.block_hashes
        if len(blocks) * view.tokens_per_block > view.preamble_tokens:
            session.chain_end = blocks[-1]
            self._ends[blocks[-1]] = session.session_id

    def _end(self, session: Session) -> None:
        if session.ended:
            return
        session.ended = True
        self._open.pop(session.session_id, None)
        if self._hops is not None and self._ttft is not None:
            self._hops.observe(session.count)
            self._ttft.observe(session.ttft_s)

    async def _sweep_loop(self) -> None:
        interval = min(max(self.config.idle_s / 4, 0.1), 5.0)
        while True:
            await asyncio.sleep(interval)
            self.sweep(time.monotonic())
