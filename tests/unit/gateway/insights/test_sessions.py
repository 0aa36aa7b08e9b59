"""insights.sessions and request.timing: bounded memory, ends, inference, decode speeds."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from gateway.config.features import SessionsConfig
from gateway.insights.sessions import Sessions
from gateway.request.timing import Timing
from gateway.request.usage import Usage
from gateway.view import RequestView

pytestmark = pytest.mark.timeout(10)


def view(
    request_id: str,
    session: str | None = None,
    blocks: tuple[int, ...] = (),
    preamble: int = 0,
    tenant: str | None = None,
    endpoint: str = "chat",
) -> RequestView:
    return RequestView(
        request_id,
        endpoint,
        "m",
        True,
        {},
        b"",
        tenant=tenant,
        session_key=session,
        block_hashes=blocks,
        tokens_per_block=16.0,
        preamble_tokens=preamble,
    )


def hop(sessions: Sessions, v: RequestView, ttft: float = 0.1) -> None:
    sessions.record(
        v,
        "m",
        "r0",
        200,
        Usage(prompt_tokens=10, cached_tokens=4, completion_tokens=5),
        Timing.of(0.01, ttft, 0.5, True, 5),
    )


def test_sizes_are_bounded_and_totals_count_every_hop() -> None:
    sessions = Sessions(SessionsConfig(max_sessions=2, max_requests=3))
    for i in range(5):
        hop(sessions, view(f"a{i}", "a"))
    hop(sessions, view("b0", "b"))
    hop(sessions, view("c0", "c"))  # evicts a, the least recently active
    assert sessions.get("a") is None
    assert [s["id"] for s in sessions.recent(10)] == ["c", "b"]
    for i in range(4):
        hop(sessions, view(f"b{i + 1}", "b"))
    b = sessions.get("b")
    assert b is not None and b["hops"] == 5 and [r["request_id"] for r in b["requests"]] == ["b2", "b3", "b4"]
    assert b["ttft_s"] == pytest.approx(0.5) and b["requests"][0]["uncached_prefill_tokens"] == 6


def test_an_idle_session_ends_once_and_a_later_request_starts_it_over() -> None:
    registry = CollectorRegistry()
    sessions = Sessions(SessionsConfig(idle_s=1.0), registry)
    hop(sessions, view("a0", "a"))
    hop(sessions, view("a1", "a"))
    sessions.sweep(1e12)
    sessions.sweep(1e12)
    assert registry.get_sample_value("affinity_gateway_session_hops_count") == 1
    assert registry.get_sample_value("affinity_gateway_session_hops_sum") == 2
    hop(sessions, view("a2", "a"))
    again = sessions.get("a")
    assert again is not None and again["hops"] == 1 and not again["ended"]


def test_a_keyless_prompt_joins_the_session_it_extends_but_not_past_a_shared_preamble() -> None:
    sessions = Sessions(SessionsConfig())
    hop(sessions, view("x0", blocks=(1, 2, 3)))
    hop(sessions, view("x1", blocks=(1, 2, 3, 4, 5)))
    hop(sessions, view("y0", blocks=(1, 2, 9)))  # shares the start only: its own session
    assert [r["request_id"] for r in sessions.get("inferred-x0")["requests"]] == ["x0", "x1"]  # type: ignore[index]
    hop(sessions, view("p0", blocks=(7, 8), preamble=32))  # ends inside its preamble: starts no chain
    hop(sessions, view("p1", blocks=(7, 8, 10), preamble=32))
    assert sessions.get("inferred-p1") is not None


def test_decode_speed_comes_from_the_request_totals() -> None:
    t = Timing.of(0.0, 0.2, 1.2, True, 11)
    assert t.decode_s == pytest.approx(1.0) and t.tokens_per_s == pytest.approx(11) and t.itl_s == pytest.approx(0.1)
    whole = Timing.of(0.0, 1.0, 1.0, False, 11)
    assert whole.decode_s is None and whole.tokens_per_s is None and whole.itl_s is None


def test_sessions_are_per_tenant_and_only_generation_requests_are_hops() -> None:
    sessions = Sessions(SessionsConfig())
    hop(sessions, view("a0", "alice", tenant="acme"))
    hop(sessions, view("b0", "alice", tenant="beta"))
    hop(sessions, view("t0", "alice", tenant="acme", endpoint="tokenize"))
    hop(sessions, view("x0", blocks=(1, 2), tenant="acme"))
    hop(sessions, view("x1", blocks=(1, 2, 3), tenant="beta"))  # extends acme's prompt: not its session
    hop(sessions, view("x0", blocks=(5, 6)))  # a repeated request id starts its own session
    assert sessions.get("acme:alice")["hops"] == 1 and sessions.get("beta:alice")["hops"] == 1  # type: ignore[index]
    assert sessions.get("inferred-x0")["hops"] == 1 and sessions.get("inferred-x1") is not None  # type: ignore[index]
    assert sessions.get("inferred-x0-1") is not None
