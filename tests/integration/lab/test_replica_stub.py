"""The replica stub as a client or router sees it: real processes on loopback ports."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers import Proc, free_port, python_module, wait_http

MODEL = "stub-model"
BLOCK = 16
Replica = Callable[..., str]


@pytest.fixture
def replica() -> Iterator[Replica]:
    """Start a replica with extra flags; returns its base URL. Stopped at teardown."""
    procs: list[Proc] = []

    def start(*flags: str, speedup: float = 20, script: bool = False) -> str:
        port = free_port()
        args = [
            "--port",
            str(port),
            "--model",
            MODEL,
            "--engine",
            "sim",
            "--speedup",
            str(speedup),
            "--log-level",
            "warning",
            *flags,
        ]
        cmd = (
            [str(Path(sys.executable).with_name("replica-stub")), *args]
            if script
            else python_module("replica_stub", *args)
        )
        proc = Proc(cmd)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", proc)
        return url

    yield start
    for proc in procs:
        proc.stop()


def metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def wait_metric(url: str, name: str, value: float, timeout_s: float = 5) -> None:
    deadline = time.monotonic() + timeout_s
    while metric(url, name) != value:
        assert time.monotonic() < deadline, f"{name} never reached {value}"
        time.sleep(0.02)


def long_text(tag: str, words: int = 300) -> str:
    return " ".join(f"{tag}{i}" for i in range(words))


def chat(url: str, messages: list[dict], **extra: object) -> dict:
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, **extra}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def stream_ttft(client: httpx.Client, url: str, messages: list[dict]) -> tuple[float, dict]:
    """Client-side time to the first content chunk, and the usage chunk."""
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start, ttft, usage = time.perf_counter(), None, None
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = httpx.Response(200, content=line[6:]).json()
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content") and ttft is None:
                ttft = time.perf_counter() - start
            usage = chunk.get("usage") or usage
    assert ttft is not None and usage is not None
    return ttft, usage


def test_streamed_chat_parses_line_by_line(replica: Replica) -> None:
    url = replica()
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi there"}],
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers={"X-Request-Id": "abc"}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-request-id"] == "abc"
        assert response.headers["x-replica-id"] == f"replica-{url.rsplit(':', 1)[1]}"
        lines = list(response.iter_lines())
    events = [line for line in lines if line]
    assert all(line.startswith("data: ") for line in events) and events[-1] == "data: [DONE]"
    chunks = [httpx.Response(200, content=line[6:]).json() for line in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "chatcmpl-abc" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert len(text.split()) == 6 and chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert all("usage" not in c for c in chunks[:-1])  # as vLLM: unset, not null


def test_openai_sdk_streaming_and_not(replica: Replica) -> None:
    url = replica(script=True)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    assert [m.id for m in client.models.list()] == [MODEL]
    messages = [{"role": "user", "content": long_text("sdk", 40)}]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, seed=3)
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 5
    assert full.usage.prompt_tokens_details.cached_tokens == 0
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=5, seed=3, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # same prompt again
    completion = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=3)
    assert completion.choices[0].text and completion.usage.total_tokens == completion.usage.prompt_tokens + 3


def test_repeated_prompt_hits_the_prefix_cache_with_lower_ttft(replica: Replica) -> None:
    url = replica(speedup=10)
    messages = [{"role": "user", "content": long_text("w", 600)}]
    with httpx.Client() as client:  # one client: creating one costs more than a warm TTFT
        cold_ttft, cold = stream_ttft(client, url, messages)
        warm_ttft, warm = stream_ttft(client, url, messages)
    assert cold["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm["prompt_tokens_details"]["cached_tokens"] >= (warm["prompt_tokens"] - 1) // BLOCK * BLOCK
    assert warm_ttft < cold_ttft / 2
    assert metric(url, "vllm:prefix_cache_hits_total") == warm["prompt_tokens_details"]["cached_tokens"]
    assert metric(url, "vllm:prefix_cache_queries_total") == cold["prompt_tokens"] + warm["prompt_tokens"]


def test_follow_up_turn_hits_on_the_previous_answer(replica: Replica) -> None:
    url = replica()
    turn1 = [{"role": "user", "content": "a question to start with please"}]
    first = chat(url, turn1, max_tokens=40, ignore_eos=True)
    answer = first["choices"][0]["message"]["content"]
    turn2 = turn1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": "and then?"}]
    second = chat(url, turn2)
    history = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= (history - 1) // BLOCK * BLOCK > first["usage"]["prompt_tokens"]


def test_lru_eviction_makes_an_old_prefix_miss(replica: Replica) -> None:
    url = replica("--num-gpu-blocks", "64", "--max-model-len", "1024")
    assert "vllm:cache_config_info{" in httpx.get(f"{url}/metrics").text
    old = [{"role": "user", "content": long_text("old", 250)}]
    chat(url, old)
    assert chat(url, old)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    for tag in "abcd":  # 4 x ~260 tokens of new prefixes > 64 blocks x 16 tokens
        chat(url, [{"role": "user", "content": long_text(tag, 250)}])
    assert chat(url, old)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    newest = [{"role": "user", "content": long_text("d", 250)}]
    assert chat(url, newest)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


async def test_requests_queue_beyond_max_num_seqs_and_all_complete(replica: Replica) -> None:
    url = replica("--max-num-seqs", "4", speedup=5)
    waiting_seen = 0.0

    async def one(client: httpx.AsyncClient, i: int) -> dict:
        body = {"model": MODEL, "prompt": f"request number {i}", "max_tokens": 50, "ignore_eos": True}
        response = await client.post(f"{url}/v1/completions", json=body)
        return response.json()

    async with httpx.AsyncClient(timeout=30) as client:
        tasks = [asyncio.create_task(one(client, i)) for i in range(12)]
        while not all(t.done() for t in tasks):
            text = (await client.get(f"{url}/metrics")).text
            for line in text.splitlines():
                if line.startswith("vllm:num_requests_waiting{"):
                    waiting_seen = max(waiting_seen, float(line.rsplit(" ", 1)[1]))
                if line.startswith("vllm:num_requests_running{"):
                    assert float(line.rsplit(" ", 1)[1]) <= 4
            await asyncio.sleep(0.01)
        results = [t.result() for t in tasks]
    assert waiting_seen > 0
    assert all(r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 50 for r in results)


def test_cancelled_stream_is_aborted_and_frees_its_slot(replica: Replica) -> None:
    url = replica(speedup=5)
    body = {"model": MODEL, "prompt": "go on forever", "max_tokens": 4000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
        assert metric(url, "vllm:num_requests_running") == 1
    wait_metric(url, "vllm:num_requests_running", 0)
    assert metric(url, "vllm:kv_cache_usage_perc") == 0


def test_client_gone_during_a_non_streaming_request_aborts_it(replica: Replica) -> None:
    url = replica(speedup=5)
    body = {"model": MODEL, "prompt": "go on forever", "max_tokens": 4000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/completions", json=body, timeout=0.3)
    wait_metric(url, "vllm:num_requests_running", 0)
    assert metric(url, "vllm:generation_tokens_total") < 4000


BAD_REQUESTS = [
    ("/v1/chat/completions", b"{not json", 400, "BadRequestError"),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}',
        400,
        "BadRequestError",
    ),  # a malformed content part: vLLM's validation answers 400 (was a 500 here)
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [7]}]}', 400, "BadRequestError"),
    ("/v1/chat/completions", b'{"model": "stub-model"}', 400, "BadRequestError"),
    ("/v1/chat/completions", b'{"messages": "hi"}', 400, "BadRequestError"),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}',
        400,
        "BadRequestError",
    ),
    (
        "/v1/chat/completions",
        b'{"model": "other", "messages": [{"role": "user", "content": "x"}]}',
        404,
        "NotFoundError",
    ),
    ("/v1/completions", b'{"prompt": "x", "n": 2}', 400, "BadRequestError"),
    ("/v1/completions", b'{"prompt": "x", "temperature": -0.5}', 400, "BadRequestError"),
    ("/v1/completions", b'{"prompt": "x", "top_p": 1.5}', 400, "BadRequestError"),
    ("/v1/completions", b'{"prompt": "x", "stop": [1]}', 400, "BadRequestError"),
    ("/v1/completions", b'{"prompt": "' + b"word " * 600 + b'"}', 400, "BadRequestError"),
    ("/v1/completions", b"[1, 2]", 400, "BadRequestError"),
    ("/tokenize", b'{"nothing": 1}', 400, "BadRequestError"),
    ("/detokenize", b'{"tokens": [123]}', 400, "BadRequestError"),
]


def test_bad_input_gets_vllm_error_json(replica: Replica) -> None:
    url = replica("--max-model-len", "512")
    for path, raw, status, type_ in BAD_REQUESTS:
        response = httpx.post(f"{url}{path}", content=raw, headers={"Content-Type": "application/json"})
        assert response.status_code == status, (path, raw[:60], response.text)
        error = response.json()["error"]
        assert error["type"] == type_ and error["code"] == status and set(error) == {"message", "type", "param", "code"}
    response = httpx.post(f"{url}/tokenize", content=b"x", headers={"Content-Type": "text/plain"})
    assert response.status_code == 415
    assert httpx.get(f"{url}/nope").status_code == 404
    assert httpx.get(f"{url}/health").status_code == 200


def test_tokenize_detokenize_version_and_stop_strings(replica: Replica) -> None:
    url = replica()
    text = "Hello, wonderful world! internationalization\n"
    tokens = httpx.post(f"{url}/tokenize", json={"prompt": text}).json()
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 8192
    assert httpx.post(f"{url}/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": text}
    assert "version" in httpx.get(f"{url}/version").json()
    body = {"model": MODEL, "prompt": "seeded", "max_tokens": 30, "ignore_eos": True, "seed": 5}
    free = httpx.post(f"{url}/v1/completions", json=body).json()["choices"][0]["text"]
    assert free == httpx.post(f"{url}/v1/completions", json=body).json()["choices"][0]["text"]  # deterministic
    stop = free.split()[3]
    stopped = httpx.post(f"{url}/v1/completions", json={**body, "stop": [stop]}).json()["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == stop
    assert stopped["text"] == free[: free.index(stop)]


def test_answers_what_sglang_routers_probe(replica: Replica) -> None:
    """sglang-router refuses a worker whose /server_info and /model_info fail; SGLang policies read /get_load."""
    url = replica("--num-gpu-blocks", "512", "--max-num-seqs", "8")
    for path in ("/server_info", "/get_server_info"):
        info = httpx.get(url + path).json()
        assert info["model_path"] == MODEL and info["max_total_num_tokens"] == 512 * BLOCK
        assert info["page_size"] == BLOCK and info["max_running_requests"] == 8
    for path in ("/model_info", "/get_model_info"):
        assert httpx.get(url + path).json()["is_generation"] is True
    httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "one two three " * 20, "max_tokens": 2})
    load = httpx.get(url + "/get_load").json()
    assert load == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
