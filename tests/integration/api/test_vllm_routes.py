"""Every vLLM route through the gateway to real stubs: httpx for the pooling and token routes, the
`openai` SDK for embeddings and the Responses API, the `anthropic` SDK for /v1/messages."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from tests.integration.gateway_procs import MODEL, Gateway, pool, running, start_gateway, start_stub

pytestmark = pytest.mark.timeout(90)
SOLO = "solo-model"  # one replica: the sim tokenizer decodes only the ids its own process produced
SYSTEM = "You are a careful archivist. " + " ".join(
    f"Drawer {i} holds the letters of year {1900 + i}." for i in range(40)
)


def question(topic: str) -> str:
    """A user turn long enough to span blocks of its own: the conversation, not the shared preamble."""
    return f"About {topic}: " + " ".join(f"Consider letter {i} on {topic} and its reply." for i in range(60))


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running() as track:
        stubs = [track(start_stub(f"route-{i}", MODEL, 1)) for i in range(2)]  # real-time prefills: worth saving
        solo = track(start_stub("solo-0", SOLO))
        yield track(
            start_gateway(
                tmp_path_factory.mktemp("routes"),
                {
                    MODEL: {
                        **pool(*((s.replica_id, s.url) for s in stubs)),
                        # no tie band: these stubs prefill fast, so a warm history saves
                        # only a few ms, within the default band where load decides
                        "routing": {
                            "policy": "prefix_affinity",
                            "explain_header": True,
                            "params": {"tie_s": 0, "tie_ratio": 0},
                        },
                    },
                    SOLO: pool(("solo-0", solo.url)),
                },
                routes={"passthrough": ["/reset_prefix_cache"]},
            )
        )


@pytest.fixture
def http(gateway: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=20) as client:
        yield client


def test_tokenize_and_detokenize(http: httpx.Client) -> None:
    tokens = http.post("/tokenize", json={"model": SOLO, "prompt": "hello there world"}).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] > 0
    text = http.post("/detokenize", json={"model": SOLO, "tokens": tokens["tokens"]}).json()
    assert "hello" in text["prompt"]
    chat = http.post("/tokenize", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > 0


def test_rerank_score_pooling_classify(http: httpx.Client) -> None:
    rerank = http.post(
        "/v1/rerank",
        json={"model": MODEL, "query": "red apples", "documents": ["blue sky", "red apples", "green apples"]},
    )
    assert rerank.status_code == 200, rerank.text
    results = rerank.json()["results"]
    assert results[0]["index"] == 1 and results[0]["relevance_score"] == 1.0
    assert {"index", "document", "relevance_score"} <= set(results[0]) and rerank.json()["usage"]["total_tokens"]
    score = http.post(
        "/v1/score", json={"model": MODEL, "text_1": "red apples", "text_2": ["red apples", "blue sky"]}
    ).json()
    assert score["object"] == "list" and [d["object"] for d in score["data"]] == ["score", "score"]
    assert score["data"][0]["score"] == 1.0 > score["data"][1]["score"]
    pooled = http.post("/pooling", json={"model": MODEL, "input": "some text"}).json()
    assert pooled["data"][0]["object"] == "pooling" and len(pooled["data"][0]["data"]) == 8
    classified = http.post("/classify", json={"model": MODEL, "input": ["good", "bad"]}).json()
    assert [d["num_classes"] for d in classified["data"]] == [2, 2]
    assert abs(sum(classified["data"][0]["probs"]) - 1) < 1e-5 and classified["usage"]["prompt_tokens"] > 0


def test_errors_keep_the_openai_shape(http: httpx.Client) -> None:
    unknown = http.post("/v1/rerank", json={"model": "nope", "query": "q", "documents": ["d"]})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == 404
    missing = http.post("/v1/messages", json={"messages": []})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"
    bad = http.post("/v1/score", json={"model": MODEL, "text_1": ["a", "b"], "text_2": ["c", "d", "e"]})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "BadRequestError"


def test_passthrough_route_and_embeddings(gateway: Gateway, http: httpx.Client) -> None:
    assert http.post("/reset_prefix_cache", json={"model": MODEL}).status_code == 200
    assert http.post("/not-configured", json={"model": MODEL}).status_code == 404
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    embedded = client.embeddings.create(model=MODEL, input=["one", "two"])
    assert len(embedded.data) == 2 and len(embedded.data[0].embedding) == 8 and embedded.usage.prompt_tokens > 0


def test_openai_responses_whole_and_streamed_with_affinity(gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    answer = client.responses.create(model=MODEL, instructions=SYSTEM, input=question("1901"), max_output_tokens=8)
    assert answer.output_text and answer.usage is not None and answer.usage.output_tokens == 8
    stream = client.responses.create(
        model=MODEL, instructions=SYSTEM, input="Where is 1931?", max_output_tokens=6, stream=True
    )
    events = list(stream)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = [e for e in events if e.type == "response.completed"]
    assert deltas and done and done[0].response.output_text == deltas
    assert done[0].response.usage is not None and done[0].response.usage.input_tokens_details.cached_tokens > 0
    for topic in ("1907", "1911", "1913", "1917"):  # the same conversation, the same replica (not by luck)
        turns = [
            client.responses.with_raw_response.create(
                model=MODEL, instructions=SYSTEM, input=question(topic), max_output_tokens=2
            )
            for _ in range(2)
        ]
        assert turns[1].headers["X-Replica-Id"] == turns[0].headers["X-Replica-Id"], (
            topic,
            [t.headers["X-Gateway-Route"] for t in turns],
        )
        usage = turns[1].parse().usage
        assert usage is not None and usage.input_tokens_details.cached_tokens > usage.input_tokens // 2


def test_anthropic_messages_whole_and_streamed_with_affinity(gateway: Gateway) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": question("1922")}]
    message = client.messages.create(model=MODEL, max_tokens=8, system=SYSTEM, messages=messages)  # type: ignore[arg-type]
    assert message.type == "message" and message.content[0].type == "text" and message.content[0].text
    assert message.usage.output_tokens == 8 and message.stop_reason == "max_tokens"
    with client.messages.stream(
        model=MODEL, max_tokens=5, system=[{"type": "text", "text": SYSTEM}], messages=messages
    ) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text and final.usage.output_tokens == 5  # type: ignore[union-attr]
    for topic in ("1924", "1926", "1927", "1929"):
        turn = [{"role": "user", "content": question(topic)}]
        turns = [
            client.messages.with_raw_response.create(model=MODEL, max_tokens=2, system=SYSTEM, messages=turn)
            for _ in range(2)
        ]  # type: ignore[arg-type]
        assert turns[1].headers["X-Replica-Id"] == turns[0].headers["X-Replica-Id"], (
            topic,
            [t.headers["X-Gateway-Route"] for t in turns],
        )
        usage = turns[1].parse().usage
        assert (usage.cache_read_input_tokens or 0) > usage.input_tokens // 2
