"""Agent-session timelines over real processes: an agent loop of 6 hops (each prompt the previous one plus
its answer and a tool result) through a gateway with replica stubs shows the 6 requests in order, with
TTFTs summing to the session's total; keyed by the session header, or inferred from the growing prefix
chain; ended sessions reach the histograms; decode speed reaches the metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config.loader import parse_config
from gateway.errors import ConfigError
from tests.integration.gateway_procs import MODEL, pool, running, start_gateway, start_stub
from tests.integration.reliability_tools import eventually

pytestmark = pytest.mark.timeout(90)
HOPS = 6
TASK = "Plan a trip. " + " ".join(f"Constraint {i}: keep step {i} under budget." for i in range(20))


def agent_loop(http: httpx.Client, prefix: str, headers: dict[str, str]) -> list[str]:
    """Six streamed hops; each next prompt extends the last by its answer and a tool result."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": TASK},
    ]
    ids = []
    for hop in range(HOPS):
        request_id = f"{prefix}-hop-{hop}"
        answer = http.post(
            "/v1/chat/completions",
            headers={**headers, "X-Request-Id": request_id},
            json={"model": MODEL, "messages": messages, "max_tokens": 8, "stream": True},
        )
        assert answer.status_code == 200, answer.text
        text = "".join(
            e["choices"][0]["delta"].get("content") or ""
            for line in answer.text.splitlines()
            if line.startswith("data: {")
            for e in [json.loads(line[6:])]
            if e.get("choices")
        )
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": f"Tool result {hop}: " + "ok " * 40},
        ]
        ids.append(request_id)
    return ids


def check_timeline(session: dict[str, Any], ids: list[str]) -> None:
    requests = session["requests"]
    assert [r["request_id"] for r in requests] == ids
    assert session["hops"] == HOPS
    assert sum(r["ttft_s"] for r in requests) == pytest.approx(session["ttft_s"], abs=1e-5)
    assert sum(r["queue_s"] for r in requests) == pytest.approx(session["queue_s"], abs=1e-5)
    assert 0 < session["prefill_share"] <= 1
    for r in requests:
        assert r["replica"] and r["status"] == 200 and r["ttft_s"] > 0 and r["decode_s"] >= 0
        assert r["uncached_prefill_tokens"] == r["prompt_tokens"] - r["cached_tokens"]
        assert r["ttft_s"] <= r["total_s"]
    assert requests[-1]["prompt_tokens"] > requests[0]["prompt_tokens"]


def test_an_agent_loop_of_six_hops_is_one_timeline(tmp_path: Path) -> None:
    with running() as track:
        stubs = [track(start_stub(f"s-{i}")) for i in range(2)]
        gateway = track(
            start_gateway(
                tmp_path,
                {MODEL: pool(*((s.replica_id, s.url) for s in stubs), policy="prefix_affinity")},
                sessions={"idle_s": 3.0, "max_sessions": 10, "max_requests": 16},
            )
        )
        with httpx.Client(base_url=gateway.url, timeout=20) as http:
            keyed = agent_loop(http, "keyed", {"X-Session-ID": "agent-1"})
            answer = http.get("/admin/sessions/agent-1")
            session = answer.json()
            assert session["source"] == "header"
            pid = gateway.proc.popen.pid  # the views are this gateway's own, and say so
            for path in ("/admin/sessions/agent-1", "/admin/sessions", "/admin/decisions", "/admin/prefix-report"):
                view = http.get(path).headers.get("X-Gateway-View", "")
                assert view.startswith("this gateway only:") and view.endswith(f"pid {pid}"), (path, view)
            check_timeline(session, keyed)

            inferred = agent_loop(http, "free", {})  # no key: the growing prefix chain names the session
            recent = http.get("/admin/sessions").json()["sessions"]
            assert recent[0]["id"] == "inferred-free-hop-0" and recent[0]["source"] == "inferred"
            assert recent[1]["id"] == "agent-1" and len(recent) == 2
            check_timeline(http.get("/admin/sessions/inferred-free-hop-0").json(), inferred)

            for body, source in (
                ({"prompt_cache_key": "pck", "user": "u"}, "prompt_cache_key"),
                ({"user": "u"}, "user"),
            ):
                http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1, **body})
                named = http.get(f"/admin/sessions/{body.get('prompt_cache_key', 'u')}").json()
                assert named["source"] == source and named["hops"] == 1

            missing = http.get("/admin/sessions/nobody")
            assert missing.status_code == 404 and "on this gateway" in missing.text
            assert missing.json()["error"]["type"] == "NotFoundError"
            assert http.get("/admin/sessions?limit=0").status_code == 400

            def ended() -> bool:  # all four idle past sessions.idle_s: observed once each
                text = http.get("/metrics").text
                return "affinity_gateway_session_hops_count 4.0" in text

            eventually(ended, timeout_s=20)
            text = http.get("/metrics").text
            assert re.search(r"affinity_gateway_session_hops_sum 14\.0", text)
            assert re.search(r'affinity_gateway_tokens_per_second_count\{model_name="stub-model"\} 12\.0', text)
            assert re.search(
                r'affinity_gateway_inter_token_latency_seconds_count\{model_name="stub-model"\} 12\.0', text
            )
            assert http.get("/admin/sessions/agent-1").json()["ended"] is True
    log = gateway.proc.output()
    event = next(
        json.loads(line)
        for line in log.splitlines()
        if '"request_id": "keyed-hop-5"' in line or '"request_id":"keyed-hop-5"' in line
    )
    assert event["tokens_per_s"] > 0 and event["itl_s"] > 0 and event["ttft_s"] > 0 and "queue_s" in event


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"max_sessions": 0}, "sessions.max_sessions"),
        ({"max_requests": -1}, "sessions.max_requests"),
        ({"idle_s": 0}, "sessions.idle_s"),
    ],
)
def test_bad_session_bounds_are_config_errors(section: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"pools": {MODEL: pool(("a", "http://h:1"))}, "sessions": section})
    assert err.value.key == key
