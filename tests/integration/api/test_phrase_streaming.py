"""Phrase-chunked streams through a real gateway process, driven with the openai SDK.

The stub's answers are a deterministic function of the prompt, so the same request streamed with and
without chunking must concatenate to the same text. The stub's words carry no punctuation: the header
pool is bounded by `max_chars`, the voice pool ends phrases at its own boundary characters. A scripted
replica that holds each chunk until the test saw the previous one shows that `max_wait_ms` sends
pending text while the replica is silent, and that the opt-in header never reaches the replica.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.integration.gateway_procs import MODEL, Gateway, pool, running, start_gateway, start_stub
from tests.upstream import FakeReplica, ThreadServer

pytestmark = pytest.mark.timeout(90)

VOICE, SCRIPTED = "voice-model", "scripted-model"
HEADER_BOUNDS = {"mode": "none", "max_wait_ms": 10000, "max_chars": 40}  # long waits: bounds by text only
VOICE_BOUNDS = {"mode": "phrase", "boundaries": "y\n", "max_wait_ms": 10000, "max_chars": 60}
PHRASE = {"X-Stream-Chunking": "phrase"}
MESSAGES = [{"role": "user", "content": "Tell me a story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, FakeReplica]]:
    scripted = FakeReplica("scripted", chunks=3, hold=threading.Event())
    with ThreadServer(scripted.app) as scripted_url, running() as track:
        stub, voice = track(start_stub("stub-0")), track(start_stub("voice-0", VOICE))
        pools = {
            MODEL: {**pool(("stub-0", stub.url)), "stream_chunking": HEADER_BOUNDS},
            VOICE: {**pool(("voice-0", voice.url)), "stream_chunking": VOICE_BOUNDS},
            SCRIPTED: {**pool(("scripted", scripted_url)), "stream_chunking": {"max_wait_ms": 200}},
        }
        yield track(start_gateway(tmp_path_factory.mktemp("phrase"), pools)), scripted


@pytest.fixture
def client(cluster: tuple[Gateway, FakeReplica]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{cluster[0].url}/v1", api_key="unused", max_retries=0) as sdk:
        yield sdk


def _chat(client: openai.OpenAI, model: str, headers: dict[str, str]) -> list[Any]:
    return list(
        client.chat.completions.create(  # type: ignore[call-overload]
            model=model,
            messages=MESSAGES,
            max_tokens=80,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
            extra_headers=headers,
        )
    )


def _completion(client: openai.OpenAI, model: str, headers: dict[str, str]) -> list[Any]:
    return list(
        client.completions.create(
            model=model,
            prompt="Once upon a time",
            max_tokens=80,
            stream=True,
            extra_body={"ignore_eos": True},
            extra_headers=headers,
        )
    )


def _texts(chunks: list[Any]) -> list[str]:
    """The text of each chunk that carries any (chat delta.content or completions text)."""
    found = []
    for chunk in chunks:
        for choice in chunk.choices:
            text = choice.delta.content if hasattr(choice, "delta") else choice.text
            if text:
                found.append(text)
    return found


def _first_phrases(gateway: Gateway, model: str) -> float:
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    found = re.search(rf'^affinity_gateway_first_phrase_seconds_count{{model_name="{model}"}} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else 0.0


def _assert_phrases(plain: list[str], phrased: list[str], boundaries: str, max_chars: int) -> None:
    assert "".join(phrased) == "".join(plain) and len("".join(plain)) > 2 * max_chars
    assert len(phrased) < len(plain)
    for text in phrased[:-1]:
        assert text[-1] in boundaries or len(text) == max_chars, (text, phrased)
        assert len(text) <= max_chars


def test_chat_phrases_concatenate_to_the_unchunked_text(
    cluster: tuple[Gateway, FakeReplica], client: openai.OpenAI
) -> None:
    gateway = cluster[0]
    before = _first_phrases(gateway, MODEL)
    plain, phrased = _chat(client, MODEL, {}), _chat(client, MODEL, PHRASE)
    _assert_phrases(_texts(plain), _texts(phrased), ",.!?;:\n", HEADER_BOUNDS["max_chars"])
    assert phrased[0].choices[0].delta.role == "assistant" and not phrased[0].choices[0].delta.content
    assert [c.choices[0].finish_reason for c in phrased if c.choices][-1] == "length"
    assert not phrased[-1].choices and phrased[-1].usage is not None
    assert phrased[-1].usage.completion_tokens == plain[-1].usage.completion_tokens == 80
    assert _texts(_chat(client, MODEL, {"X-Stream-Chunking": "none"})) == _texts(plain)  # opted out: token chunks
    assert _first_phrases(gateway, MODEL) == before + 1  # only the chunked stream counts


def test_a_pool_chunks_by_its_own_boundaries_chat_and_completions(
    cluster: tuple[Gateway, FakeReplica], client: openai.OpenAI
) -> None:
    gateway = cluster[0]
    before = _first_phrases(gateway, VOICE)
    for call in (_chat, _completion):
        plain, phrased = call(client, VOICE, {"X-Stream-Chunking": "none"}), call(client, VOICE, {})
        _assert_phrases(_texts(plain), _texts(phrased), VOICE_BOUNDS["boundaries"], VOICE_BOUNDS["max_chars"])
        assert any(text.endswith("y") for text in _texts(phrased)[:-1])
        assert [c.choices[0].finish_reason for c in phrased if c.choices][-1] == "length"
    assert _first_phrases(gateway, VOICE) == before + 2
    assert (
        'affinity_gateway_first_phrase_seconds_bucket{le="300.0",model_name="voice-model"}'
        in httpx.get(f"{gateway.url}/metrics", timeout=5).text
    )  # TTFT's buckets


def test_max_wait_sends_text_while_the_replica_is_silent_and_the_header_stays_here(
    cluster: tuple[Gateway, FakeReplica],
) -> None:
    gateway, scripted = cluster
    assert scripted.hold is not None
    body = {"model": SCRIPTED, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    received, arrivals = b"", []
    started = time.monotonic()
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body, headers=PHRASE, timeout=10) as resp:
        assert resp.status_code == 200
        for data in resp.iter_raw():
            received += data
            while len(arrivals) < scripted.chunks and f"tok{len(arrivals)} ".encode() in received:
                arrivals.append(time.monotonic() - started)
                if len(arrivals) < scripted.chunks:
                    scripted.hold.set()  # the replica sends its next chunk only now that this one arrived
    assert len(arrivals) == scripted.chunks and received.endswith(b"data: [DONE]\n\n")
    # no boundary and a silent replica: each token waited max_wait_ms (200) at the gateway; the last
    # went out with the usage chunk that followed it
    assert arrivals[0] >= 0.15 and arrivals[1] - arrivals[0] >= 0.15
    assert scripted.seen[-1].headers.get("X-Stream-Chunking") is None


def test_an_unknown_header_value_is_a_400_in_the_openai_shape(
    cluster: tuple[Gateway, FakeReplica], client: openai.OpenAI
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, MODEL, {"X-Stream-Chunking": "words"})
    assert err.value.status_code == 400
    answer = httpx.post(
        f"{cluster[0].url}/v1/completions",
        headers={"X-Stream-Chunking": "words"},
        json={"model": MODEL, "prompt": "x", "max_tokens": 1},
        timeout=5,
    )
    assert answer.status_code == 400
    assert answer.json()["error"] == {
        "message": "X-Stream-Chunking must be phrase or none, got 'words'",
        "type": "BadRequestError",
        "param": "X-Stream-Chunking",
        "code": 400,
    }
