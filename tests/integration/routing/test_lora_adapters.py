"""LoRA adapters through a real gateway in front of real stubs, with the `openai` SDK.

Replica r-0 serves adapters `sql` and `chat`, r-1 only `chat` (`--lora-modules`); the gateway
declares none and learns them from the replicas' `/v1/models`. Requests for `sql` can only go to
r-0, `chat` is routed cache-aware between both, and the same prompt under two adapters never shares
cached tokens, on the replica or in the gateway's predictions from the replicas' KV events.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.helpers import free_port
from tests.integration.gateway_procs import MODEL, STEADY_HEALTH, Stub, running, start_gateway
from tests.integration.reliability_tools import eventually

pytestmark = pytest.mark.timeout(90)
ADAPTERS = {"r-0": ("sql=/loras/sql", "chat=/loras/chat"), "r-1": ("chat=/loras/chat",)}


def text(tag: str, words: int = 200) -> str:
    return " ".join(f"{tag}{i}" for i in range(words))


def start(replica_id: str) -> tuple[Stub, dict[str, Any]]:
    events, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    stub = Stub(replica_id, free_port(), MODEL, 50).start(
        "--kv-events-endpoint",
        events,
        "--kv-events-replay-endpoint",
        replay,
        "--kv-events-encoding",
        "map",
        "--lora-modules",
        *ADAPTERS[replica_id],
    )
    return stub, {"url": stub.url, "name": replica_id, "kv_events": {"endpoint": events, "replay_endpoint": replay}}


def complete(client: openai.OpenAI, model: str, prompt: str) -> tuple[str, int]:
    """The replica that answered and the prompt tokens it had cached."""
    raw = client.completions.with_raw_response.create(model=model, prompt=prompt, max_tokens=4, temperature=0)
    usage = raw.parse().usage
    assert raw.parse().model == model and usage is not None and usage.prompt_tokens_details is not None
    return raw.headers["X-Replica-Id"], usage.prompt_tokens_details.cached_tokens or 0


def predicted(http: httpx.Client, model: str, prompt: str) -> dict[str, int]:
    answer = http.post("/admin/route/explain", json={"model": model, "prompt": prompt}).json()
    return {c["replica"]: c["cached_tokens"] for c in answer["candidates"]}


def test_adapters_route_to_their_replicas_and_never_share_cached_tokens(tmp_path: Path) -> None:
    with running() as track:
        (r0, e0), (r1, e1) = (start(name) for name in ADAPTERS)
        track(r0), track(r1)
        pool = {
            "replicas": [e0, e1],
            "routing": {"policy": "prefix_affinity", "prefix": {"tokenizer": "sim", "block_tokens": 16}},
        }
        gateway = track(start_gateway(tmp_path, {MODEL: pool}, health=STEADY_HEALTH))
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=20)
        with httpx.Client(base_url=gateway.url, timeout=10) as http:

            def listed() -> dict[str, Any]:
                return {m["id"]: m for m in http.get("/v1/models").json()["data"]}

            eventually(lambda: {"sql", "chat"} <= set(listed()))
            assert {k: (v.get("parent"), v.get("root")) for k, v in listed().items()} == {
                MODEL: (None, MODEL),
                "sql": (MODEL, "/loras/sql"),
                "chat": (MODEL, "/loras/chat"),
            }

            assert {complete(client, "sql", text(f"a{i}-"))[0] for i in range(6)} == {"r-0"}

            homes = {}
            for i in range(4):  # cache-aware among the replicas serving it: a repeat goes home and hits
                homes[i], cached = complete(client, "chat", text(f"b{i}-"))
                assert cached == 0
            for i in range(4):
                assert complete(client, "chat", text(f"b{i}-"))[0] == homes[i]
            assert complete(client, "chat", text("b0-"))[1] > 0

            shared = text("same-")
            assert complete(client, "sql", shared) == ("r-0", 0)
            eventually(lambda: predicted(http, "sql", shared)["r-0"] > 0)  # its KV events reached the gateway
            assert set(predicted(http, "chat", shared).values()) == {0}  # ... and predict nothing for chat
            assert set(predicted(http, MODEL, shared).values()) == {0}  # ... nor for the base model
            assert complete(client, "chat", shared)[1] == 0
            again = text("again-")
            assert complete(client, "sql", again) == ("r-0", 0)
            same_replica = httpx.post(
                f"{r0.url}/v1/completions", timeout=10, json={"model": "chat", "prompt": again, "max_tokens": 2}
            ).json()
            assert same_replica["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # r-0 holds sql's blocks
            replica, cached = complete(client, "sql", again)
            assert replica == "r-0" and cached > 0

            with pytest.raises(openai.NotFoundError, match="`nope`"):
                client.completions.create(model="nope", prompt="x", max_tokens=2)
            metrics = http.get("/metrics").text
            assert (
                f'model_name="{MODEL}"' in metrics
                and 'model_name="sql"' not in metrics
                and 'model_name="chat"' not in metrics
            )


def test_declared_adapters_and_no_healthy_replica_serving_one(tmp_path: Path) -> None:
    with running() as track:
        r0 = track(Stub("r-0", free_port(), MODEL, 50).start("--lora-modules", "sql=/loras/sql"))
        r1 = track(Stub("r-1", free_port(), MODEL, 50).start())
        pool = {
            "replicas": [{"url": r0.url, "name": "r-0", "adapters": ["sql"]}, {"url": r1.url, "name": "r-1"}],
            "routing": {"policy": "round_robin"},
        }
        gateway = track(start_gateway(tmp_path, {MODEL: pool}, load={"enabled": False}, health=STEADY_HEALTH))
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=20)
        assert {complete(client, "sql", text(f"d{i}-"))[0] for i in range(4)} == {"r-0"}
        r0.stop()
        eventually(lambda: not gateway.replicas()["r-0"]["available"])
        with pytest.raises(openai.InternalServerError) as info:  # known, but none healthy: 503, not 404
            client.completions.create(model="sql", prompt="x", max_tokens=2)
        assert info.value.status_code == 503 and "'sql'" in str(info.value)
        assert complete(client, MODEL, "x y z")[0] == "r-1"
