"""Tracing (observability.tracing): a real app before fake replicas, spans caught by an in-memory exporter."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from gateway.config.loader import parse_config
from gateway.config.sections import TracingConfig
from gateway.errors import ConfigError
from gateway.observability.tracing import Tracing
from gateway.serving.app import make_app
from gateway.serving.app_keys import OBSERVERS, TRACING
from tests.upstream import FakeReplica, serve_fakes

pytestmark = pytest.mark.timeout(30)

MODEL = "m1"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"

Client = TestClient[web.Request, web.Application]
Start = Callable[..., Awaitable[tuple[Client, InMemorySpanExporter]]]


def config_data(urls: list[str], policy: str = "round_robin", **overrides: Any) -> dict[str, Any]:
    return {
        "pools": {
            MODEL: {
                "replicas": [{"url": u, "name": f"r{i}"} for i, u in enumerate(urls)],
                "routing": {"policy": policy},
            }
        },
        "health": {"interval_s": 0.05, "timeout_s": 0.5, "unhealthy_after": 1},
        "load": {"interval_s": 0.05},
        **overrides,
    }


@pytest.fixture
async def traced() -> AsyncIterator[Start]:
    """A gateway with tracing on, exporting to an in-memory exporter of its own provider."""
    servers: list[TestServer] = []
    clients: list[Client] = []

    async def start(
        *fakes: FakeReplica, sampling_ratio: float = 1.0, **overrides: Any
    ) -> tuple[Client, InMemorySpanExporter]:
        app = make_app(parse_config(config_data(await serve_fakes(fakes, servers), **overrides)))
        exporter = InMemorySpanExporter()
        app[TRACING] = tracing = Tracing(TracingConfig(enabled=True, sampling_ratio=sampling_ratio), exporter)
        app[OBSERVERS].add(tracing)  # make_app adds the tracing observer when the config turns tracing on
        client = TestClient(TestServer(app))
        await client.start_server()
        clients.append(client)
        return client, exporter

    yield start
    for client in clients:
        await client.close()
    for server in servers:
        await server.close()


def by_trace(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    traces: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        assert span.context is not None
        traces.setdefault(format(span.context.trace_id, "032x"), []).append(span)
    return traces


def children(spans: list[ReadableSpan], root: ReadableSpan, name_start: str) -> list[ReadableSpan]:
    assert root.context is not None
    return [
        s
        for s in spans
        if s.name.startswith(name_start) and s.parent is not None and s.parent.span_id == root.context.span_id
    ]


async def test_one_trace_per_request_with_server_routing_and_attempt_spans(traced: Start) -> None:
    fake = FakeReplica("r0")
    client, exporter = await traced(fake)
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        for _ in range(2):
            resp = await client.post(
                "/v1/chat/completions", json={**CHAT, "stream": True}, headers={"X-Request-Id": "req-1"}
            )
            assert resp.status == 200
            await resp.read()
    traces = by_trace(exporter.get_finished_spans())
    assert len(traces) == 2
    for trace_id, spans in traces.items():
        (server,) = [s for s in spans if s.kind == SpanKind.SERVER]
        assert server.name == "POST /v1/chat/completions" and server.parent is None
        attrs = server.attributes or {}
        assert attrs["gateway.model"] == MODEL and attrs["gateway.endpoint"] == "chat"
        assert attrs["gateway.stream"] is True and attrs["gateway.request_id"] == "req-1"
        assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"] == MODEL
        assert attrs["http.response.status_code"] == 200
        assert attrs["gateway.route.policy"] == "round_robin" and attrs["gateway.route.replica"] == "r0"
        assert attrs["gateway.route.reason"] == "round_robin"
        assert [e.name for e in server.events] == ["first_byte"]
        (route,) = children(spans, server, "route")
        assert (route.attributes or {})["gateway.route.replica"] == "r0"
        assert len(children(spans, server, "admission")) == 1
        (attempt,) = children(spans, server, "upstream")
        assert attempt.kind == SpanKind.CLIENT
        assert (attempt.attributes or {})["gateway.replica"] == "r0"
        assert (attempt.attributes or {})["gateway.outcome"] == "ok"
        assert attempt.context is not None
        sent = [s for s in fake.seen if s.headers["traceparent"].split("-")[1] == trace_id]
        assert len(sent) == 1  # the replica got the attempt's own context
        assert sent[0].headers["traceparent"].split("-")[2] == format(attempt.context.span_id, "016x")
        (line,) = [e for e in logs if e["event"] == "request" and e.get("trace_id") == trace_id]
        assert line["replica"] == "r0"
    assert "trace_id" not in structlog.contextvars.get_contextvars()  # cleared at the end


async def test_prefix_affinity_decision_attributes(traced: Start) -> None:
    client, exporter = await traced(FakeReplica("r0"), FakeReplica("r1"), policy="prefix_affinity")
    long = {"model": MODEL, "messages": [{"role": "user", "content": "a warm prefix " * 200}]}  # whole blocks
    assert (await client.post("/v1/chat/completions", json=long)).status == 200
    (route,) = [s for s in exporter.get_finished_spans() if s.name == "route"]
    (server,) = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
    for attrs in (route.attributes or {}, server.attributes or {}):
        assert attrs["gateway.route.policy"] == "prefix_affinity" and attrs["gateway.route.candidates"] == 2
        assert attrs["gateway.route.predicted_ttft_s"] > 0 and attrs["gateway.route.predicted_cached_tokens"] == 0
        assert attrs["gateway.route.evidence"] == "characters" and attrs["gateway.route.reason"]


async def test_incoming_traceparent_is_continued_and_replaced_upstream(traced: Start) -> None:
    fake = FakeReplica("r0")
    client, exporter = await traced(fake)
    parent = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"
    resp = await client.post("/v1/chat/completions", json=CHAT, headers={"traceparent": parent})
    assert resp.status == 200
    (server,) = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert server.context is not None and server.parent is not None
    assert format(server.context.trace_id, "032x") == CLIENT_TRACE
    assert format(server.parent.span_id, "016x") == "b7ad6b7169203331"
    sent = fake.seen[0].headers["traceparent"]
    assert sent != parent and sent.split("-")[1] == CLIENT_TRACE


async def test_a_retry_is_a_second_attempt_span(traced: Start) -> None:
    client, exporter = await traced(FakeReplica("r0", status=500), FakeReplica("r1"))
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        for _ in range(2):  # round robin: one of the two starts on the failing replica
            assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    retried_ids = [
        trace_id
        for trace_id, spans in by_trace(exporter.get_finished_spans()).items()
        if len([s for s in spans if s.kind == SpanKind.CLIENT]) == 2
    ]
    assert len(retried_ids) == 1
    assert [e["event"] for e in logs if e.get("trace_id") == retried_ids[0]] == ["upstream_retry", "request"]
    spans = by_trace(exporter.get_finished_spans())[retried_ids[0]]
    attempts = sorted(
        (s for s in spans if s.kind == SpanKind.CLIENT), key=lambda s: (s.attributes or {})["gateway.attempt"]
    )
    assert [(a.attributes or {})["gateway.replica"] for a in attempts] == ["r0", "r1"]
    assert [(a.attributes or {})["gateway.outcome"] for a in attempts] == ["http_500", "ok"]
    (server,) = [s for s in spans if s.kind == SpanKind.SERVER]
    assert (server.attributes or {})["gateway.retried_from"] == ("r0",)
    assert len([s for s in spans if s.name == "route"]) == 2


async def test_tracing_off_forwards_the_clients_traceparent_as_it_came() -> None:
    fake = FakeReplica("r0")
    server = TestServer(fake.app)
    await server.start_server()
    app = make_app(parse_config(config_data([str(server.make_url("")).rstrip("/")])))
    assert app[TRACING] is None
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        parent = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"
        with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
            assert (await client.post("/v1/chat/completions", json=CHAT, headers={"traceparent": parent})).status == 200
        assert fake.seen[0].headers["traceparent"] == parent
        assert all("trace_id" not in e for e in logs)
    finally:
        await client.close()
        await server.close()


def test_disabled_tracing_needs_no_opentelemetry() -> None:
    """With opentelemetry made unimportable, the app builds and serves: the gateway imports none of it
    while tracing is off (redis-py imports it on its own when it is installed, so sys.modules cannot tell)."""
    code = (
        "import sys, asyncio\n"
        "sys.modules['opentelemetry'] = None  # any import of it raises ImportError\n"
        "from aiohttp.test_utils import TestClient, TestServer\n"
        "from gateway.config.loader import parse_config\n"
        "from gateway.serving.app import make_app\n"
        "async def main():\n"
        "    app = make_app(parse_config({'pools': {'m': {'replicas': [{'url': 'http://127.0.0.1:9'}]}}}))\n"
        "    async with TestClient(TestServer(app)) as client:\n"
        "        resp = await client.post('/v1/chat/completions', json={'model': 'm', 'messages': []})\n"
        "        print(resp.status)\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20, check=True)
    assert out.stdout.splitlines()[-1] in ("502", "503"), out.stderr


@pytest.mark.parametrize(
    ("tracing", "key"),
    [
        ({"endpoint": "collector:4318"}, "tracing.endpoint"),
        ({"sampling_ratio": 1.5}, "tracing.sampling_ratio"),
        ({"service_name": ""}, "tracing.service_name"),
        ({"protocol": "grpc"}, "tracing.protocol"),
        ({"enabled": "yes"}, "tracing.enabled"),
        ({"sample": 1}, "tracing.sample"),
    ],
)
def test_config_errors_name_the_key(tracing: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(config_data(["http://127.0.0.1:9"], tracing=tracing))
    assert info.value.key == key


async def test_an_unsampled_root_costs_no_span_and_a_clients_sampled_flag_wins(traced: Start) -> None:
    """A request the ratio does not sample carries the null trace: no traceparent made up for the replica,
    no trace id in its log event (no span of it is recorded anywhere). A client's sampled parent is followed
    whatever the ratio."""
    fake = FakeReplica("r0")
    client, exporter = await traced(fake, sampling_ratio=0.0)
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
        sampled = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"
        assert (await client.post("/v1/chat/completions", json=CHAT, headers={"traceparent": sampled})).status == 200
    unsampled, followed = fake.seen
    assert "traceparent" not in unsampled.headers
    parts = followed.headers["traceparent"].split("-")
    assert parts[1] == CLIENT_TRACE and int(parts[3], 16) & 1
    assert [e.get("trace_id") for e in logs if e["event"] == "request"] == [None, CLIENT_TRACE]
    assert {format(s.context.trace_id, "032x") for s in exporter.get_finished_spans() if s.context} == {CLIENT_TRACE}


async def test_a_clients_unsampled_parent_is_followed_and_propagated(traced: Start) -> None:
    fake = FakeReplica("r0")
    client, exporter = await traced(fake, sampling_ratio=1.0)
    unsampled = f"00-{CLIENT_TRACE}-b7ad6b7169203331-00"
    assert (await client.post("/v1/chat/completions", json=CHAT, headers={"traceparent": unsampled})).status == 200
    parts = fake.seen[0].headers["traceparent"].split("-")
    assert parts[1] == CLIENT_TRACE and not int(parts[3], 16) & 1
    assert exporter.get_finished_spans() == ()


async def test_a_5xx_answer_marks_the_server_span_as_an_error(traced: Start) -> None:
    from opentelemetry.trace import StatusCode

    client, exporter = await traced(FakeReplica("r0", status=500), FakeReplica("r1", status=500))
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 500  # poison: the second 5xx as it is
    spans = exporter.get_finished_spans()
    (server,) = [s for s in spans if s.kind == SpanKind.SERVER]
    assert server.status.status_code == StatusCode.ERROR
    assert [(s.attributes or {})["gateway.outcome"] for s in spans if s.kind == SpanKind.CLIENT] == ["http_500"] * 2


def test_enabled_without_the_otel_extra_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if not installed
    with pytest.raises(ConfigError) as info:
        parse_config(config_data(["http://127.0.0.1:9"], tracing={"enabled": True}))
    assert info.value.key == "tracing.enabled" and "[otel]" in info.value.reason


def test_defaults_are_off() -> None:
    config = parse_config(config_data(["http://127.0.0.1:9"], tracing={"sampling_ratio": 0.25}))
    assert config.tracing == TracingConfig(sampling_ratio=0.25) and not config.tracing.enabled
