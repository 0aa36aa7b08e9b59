"""prefix_affinity over real processes: explainable decisions, and one picture shared through Redis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.integration.gateway_procs import MODEL, pool, running, start_gateway, start_stub

SYSTEM = {"role": "system", "content": "You are a careful assistant. " + "Answer briefly and well. " * 40}


def chat(url: str, messages: list[dict[str, str]]) -> httpx.Response:
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response


def conversation_turns(gateway_urls: list[str], turns: int) -> list[str]:
    """Run one conversation, turn i through gateway i % len(urls); return the replica of each turn."""
    messages: list[dict[str, Any]] = [SYSTEM]
    replicas = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Turn {turn}: tell me about topic {turn} " * 20})
        response = chat(gateway_urls[turn % len(gateway_urls)], messages)
        replicas.append(response.headers["X-Replica-Id"])
        messages.append(response.json()["choices"][0]["message"])
    return replicas


def test_explain_endpoint_and_route_header(tmp_path: Path) -> None:
    with running() as track:
        stubs = [track(start_stub(f"r{i}")) for i in range(3)]
        routing_pool = pool(*((s.replica_id, s.url) for s in stubs), policy="prefix_affinity")
        routing_pool["routing"]["explain_header"] = True
        gateway = track(start_gateway(tmp_path, {MODEL: routing_pool}))
        messages = [SYSTEM, {"role": "user", "content": "What is a prefix cache? " * 30}]
        first = chat(gateway.url, messages)
        header = first.headers["X-Gateway-Route"]
        assert header.startswith(f"replica={first.headers['X-Replica-Id']};reason=")
        assert all(f"{s.replica_id}:ttft=" in header for s in stubs)

        explained = httpx.post(
            f"{gateway.url}/admin/route/explain", json={"model": MODEL, "messages": messages}, timeout=10
        ).json()
        rows = {row["replica"]: row for row in explained["candidates"]}
        assert explained["policy"] == "prefix_affinity" and explained["prefix_blocks"] > 0
        # The replica that served the prompt holds it; the others hold nothing of it.
        assert explained["replica"] == first.headers["X-Replica-Id"]
        assert rows[explained["replica"]]["cached_tokens"] > 0
        assert all(rows[r]["cached_tokens"] == 0 for r in rows if r != explained["replica"])

        bad = httpx.post(f"{gateway.url}/admin/route/explain", json={"model": "nope", "messages": []}, timeout=10)
        assert bad.status_code == 404 and bad.json()["error"]["code"] == 404


def _first_turn(api: str, user: dict[str, Any], stream: bool) -> tuple[str, dict[str, Any]]:
    """The first turn's path and body on `api`: the same conversation in each API's shape."""
    common = {"model": MODEL, "max_tokens": 64, "temperature": 0, "stream": stream}
    if api == "chat":
        return "/v1/chat/completions", {**common, "messages": [SYSTEM, user]}
    if api == "messages":
        return "/v1/messages", {**common, "system": SYSTEM["content"], "messages": [user]}
    return "/v1/responses", {**common, "instructions": SYSTEM["content"], "input": user["content"]}


def _answer_text(api: str, answer: httpx.Response, stream: bool) -> str:
    if not stream:
        body = answer.json()
        if api == "chat":
            return str(body["choices"][0]["message"]["content"])
        if api == "messages":
            return "".join(block["text"] for block in body["content"] if block["type"] == "text")
        return "".join(part["text"] for item in body["output"] if item["type"] == "message" for part in item["content"])
    events = [orjson.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")]
    if api == "chat":
        return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    if api == "messages":
        return "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_the_answer_is_recorded_as_its_conversations_next_prefix(tmp_path: Path, api: str, stream: bool) -> None:
    """The answer's blocks are recorded for the replica that wrote it (after the answer has gone, with what
    only records; a stream's last events are read for its text only then): the next turn, which repeats it,
    finds more of its prompt warm there than the first turn's prompt alone. On every API that carries a
    conversation: the same conversation keys the same blocks on each, so the route explainer's chat shape
    reads what a turn on any of them recorded."""
    with running() as track:
        stubs = [track(start_stub(f"r{i}")) for i in range(2)]
        routing_pool = pool(*((s.replica_id, s.url) for s in stubs), policy="prefix_affinity")
        gateway = track(start_gateway(tmp_path, {MODEL: routing_pool}))
        user = {"role": "user", "content": "What is a prefix cache? " * 30}
        path, body = _first_turn(api, user, stream)
        first = httpx.post(f"{gateway.url}{path}", json=body, timeout=30)
        assert first.status_code == 200, first.text
        home = first.headers["X-Replica-Id"]
        text = _answer_text(api, first, stream)
        assert len(text) > 100  # past a block of its own

        def cached_at_home(messages: list[dict[str, Any]]) -> int:
            explained = httpx.post(
                f"{gateway.url}/admin/route/explain", json={"model": MODEL, "messages": messages}, timeout=10
            ).json()
            return int({row["replica"]: row for row in explained["candidates"]}[home]["cached_tokens"])

        prompt_only = cached_at_home([SYSTEM, user])
        assert prompt_only > 0
        assert cached_at_home([SYSTEM, user, {"role": "assistant", "content": text}]) > prompt_only


def test_queued_prefill_is_released_at_the_first_token(tmp_path: Path) -> None:
    """The cost model's queue of prefill sent to a replica moves up when the answer's first byte
    arrives, not when a long answer ends (it would keep the replica looking busy meanwhile)."""
    with running() as track:
        stub = track(start_stub("r0", MODEL, 1))  # real-time steps: the answer streams for seconds
        routing_pool = pool((stub.replica_id, stub.url), policy="prefix_affinity")
        # A deliberately high prefill price: the prompt queues about a minute of predicted prefill. The price of
        # the context still decoding (context_weight) is not the queued prefill: off, to see the release alone.
        routing_pool["routing"]["params"] = {
            "prefill_s_per_token": 0.2,
            "per_request_tokens": 0,
            "learn_alpha": 0,
            "context_weight": 0,
        }
        gateway = track(start_gateway(tmp_path, {MODEL: routing_pool}))
        messages = [SYSTEM]
        body = {"model": MODEL, "messages": messages, "max_tokens": 100, "stream": True, "ignore_eos": True}

        def queued_wait_s() -> float:
            explained = httpx.post(
                f"{gateway.url}/admin/route/explain", json={"model": MODEL, "messages": messages}, timeout=10
            ).json()
            return explained["candidates"][0]["wait_s"]

        with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body, timeout=60) as response:
            chunks = response.iter_bytes()
            assert next(chunks).startswith(b"data: ")
            assert queued_wait_s() < 1.0  # released at the first byte, with the answer still streaming
            assert sum(1 for _ in chunks) > 10


def test_two_gateways_sharing_redis_keep_a_conversation_on_one_replica(tmp_path: Path, redis_url: str) -> None:
    with running() as track:
        stubs = [track(start_stub(f"r{i}")) for i in range(3)]
        pools = {MODEL: pool(*((s.replica_id, s.url) for s in stubs), policy="prefix_affinity")}
        shared = {"redis": {"url": redis_url, "key_prefix": f"test-{tmp_path.name}:"}, "index": {"store": "redis"}}
        gateways = [track(start_gateway(tmp_path, pools, **shared)) for _ in range(2)]
        for _ in range(3):
            replicas = conversation_turns([g.url for g in gateways], turns=4)
            assert len(set(replicas)) == 1, replicas


def test_a_replica_that_refused_the_connection_holds_nothing_of_the_request(tmp_path: Path) -> None:
    """A request whose first choice refuses the connection is retried elsewhere; the refusing replica
    keeps no warm prefix and no queued prefill of it (the failed attempt takes back what it recorded)."""
    from tests.helpers import free_port
    from tests.integration.reliability_tools import metric

    with running() as track:
        live = track(start_stub("live"))
        dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused
        never_eject = {"interval_s": 60.0, "unhealthy_after": 1000, "eject_after_failures": 1000}
        gateway = track(
            start_gateway(
                tmp_path,
                {MODEL: pool(("dead", dead), ("live", live.url), policy="prefix_affinity")},
                health=never_eject,
            )
        )
        prompts = [
            [SYSTEM, {"role": "user", "content": f"Request {i}: " + "describe the river valley. " * 40}]
            for i in range(6)
        ]
        for messages in prompts:
            assert chat(gateway.url, messages).headers["X-Replica-Id"] == "live"
        assert (metric(gateway, 'affinity_gateway_upstream_errors_total{kind="connect",replica="dead"}') or 0) >= 1
        for messages in prompts:
            body = {"model": MODEL, "messages": messages, "max_tokens": 8}
            explained = httpx.post(f"{gateway.url}/admin/route/explain", json=body, timeout=10).json()
            rows = {row["replica"]: row for row in explained["candidates"]}
            assert rows["live"]["cached_tokens"] > 0
            assert rows["dead"]["cached_tokens"] == 0 and rows["dead"]["wait_s"] == 0.0, rows["dead"]


def test_a_pool_without_a_routing_section_routes_by_prefix_affinity(tmp_path: Path) -> None:
    with running() as track:
        stubs = [track(start_stub(f"r{i}")) for i in range(2)]
        replicas = {"replicas": [{"url": s.url, "name": s.replica_id} for s in stubs]}  # no `routing:` at all
        gateway = track(start_gateway(tmp_path, {MODEL: replicas}))
        messages = [SYSTEM, {"role": "user", "content": "Which policy is this? " * 30}]
        first, second = chat(gateway.url, messages), chat(gateway.url, messages)
        assert second.headers["X-Replica-Id"] == first.headers["X-Replica-Id"]
        assert second.headers["X-Affinity-Reason"] == "prefix_hit"
        assert (
            gateway.replicas()
            and httpx.get(f"{gateway.url}/admin/replicas").json()[MODEL]["policy"] == "prefix_affinity"
        )
