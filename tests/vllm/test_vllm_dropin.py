"""Drop-in on real vLLM started with an API key: the gateway sends the backend key it is given
(`api_key_file`) and never the client's, and vLLM's own non-generation routes (`/tokenize`,
`/detokenize`) and its Anthropic and Responses APIs (`/v1/messages`, `/v1/responses`, stored
responses by id) answer through it as they answer directly."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from gateway.relay.sse_usage import SSEUsageScanner
from gateway.request.usage import Usage
from lab import vllm_replica
from lab.vllm_replica import VLLMReplica
from tests.helpers import Proc, free_port, wait_http
from tests.integration.gateway_procs import Gateway, start_gateway
from tests.vllm.conftest import MODEL, NUM_BLOCKS, VLLMPair

pytestmark = pytest.mark.timeout(420)  # includes this module's own vLLM start-up

BACKEND_KEY = "backend-secret-7f3a"


@pytest.fixture(scope="module")
def keyed_gateway(vllm: VLLMPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, str]]:
    """A third vLLM that wants BACKEND_KEY (vLLM reads VLLM_API_KEY like `--api-key`), behind a gateway
    that has the key in a file. Started after the session pair, so the two never load at once."""
    run_dir = tmp_path_factory.mktemp("keyed-vllm")
    replica = VLLMReplica(
        2, free_port(), free_port(), free_port(), run_dir, MODEL, num_blocks=NUM_BLOCKS, log_level="warning"
    )
    proc = Proc(
        replica.command(), env={**replica.env(), "VLLM_API_KEY": BACKEND_KEY, "VLLM_ENABLE_RESPONSES_API_STORE": "1"}
    )
    gw = None
    try:
        wait_http(f"{replica.url}/health", proc, timeout=vllm_replica.START_TIMEOUT_S)
        key_file = run_dir / "backend.key"
        key_file.write_text(BACKEND_KEY + "\n")
        pool = {
            MODEL: {
                "replicas": [{"url": replica.url, "name": "keyed"}],
                "api_key_file": str(key_file),
                "routing": {"policy": "prefix_affinity"},
            }
        }
        gw = start_gateway(run_dir, pool, timeouts={"connect_s": 2.0, "first_byte_s": 120.0})
        yield gw, replica.url
    finally:
        if gw is not None:
            gw.stop()
        proc.stop(timeout=30)


def test_the_keyed_replica_refuses_without_the_key_and_answers_through_the_gateway(
    keyed_gateway: tuple[Gateway, str],
) -> None:
    gw, replica_url = keyed_gateway
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}
    direct = httpx.post(
        f"{replica_url}/v1/chat/completions", json=body, timeout=60, headers={"Authorization": "Bearer client-key"}
    )
    assert direct.status_code == 401  # the client's key is not the replica's
    answer = openai.OpenAI(
        base_url=f"{gw.url}/v1", api_key="client-key", timeout=120, max_retries=0
    ).chat.completions.create(**body)
    assert answer.choices[0].message.content


def test_tokenize_and_detokenize_answer_as_vllm_does(keyed_gateway: tuple[Gateway, str]) -> None:
    gw, replica_url = keyed_gateway
    auth = {"Authorization": f"Bearer {BACKEND_KEY}"}
    body = {"model": MODEL, "prompt": "The capital of France is"}
    through = httpx.post(f"{gw.url}/tokenize", json=body, timeout=30)
    assert through.status_code == 200, through.text
    assert (
        through.json()["tokens"]
        == httpx.post(f"{replica_url}/tokenize", json=body, headers=auth, timeout=30).json()["tokens"]
    )
    back = httpx.post(f"{gw.url}/detokenize", json={"model": MODEL, "tokens": through.json()["tokens"]}, timeout=30)
    assert back.status_code == 200, back.text
    assert back.json()["prompt"] == "The capital of France is"


def test_anthropic_messages_through_the_gateway(keyed_gateway: tuple[Gateway, str]) -> None:
    gw, _ = keyed_gateway
    client = anthropic.Anthropic(base_url=gw.url, api_key="client-key", timeout=120, max_retries=0)
    greedy = {"temperature": 0}  # this SDK's create() has no temperature argument any more; vLLM reads it
    message = client.messages.create(
        model=MODEL, max_tokens=8, extra_body=greedy, messages=[{"role": "user", "content": "Name a colour."}]
    )
    assert message.content and message.content[0].type == "text" and message.content[0].text
    with client.messages.stream(
        model=MODEL, max_tokens=8, extra_body=greedy, messages=[{"role": "user", "content": "Name a colour."}]
    ) as stream:
        streamed = "".join(stream.text_stream)
    assert streamed == message.content[0].text  # greedy: the same answer streamed or not


def test_responses_stored_and_continued_through_the_gateway(keyed_gateway: tuple[Gateway, str]) -> None:
    gw, _ = keyed_gateway
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="client-key", timeout=120, max_retries=0)
    response = client.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=16, temperature=0)
    assert response.output_text, response
    assert client.responses.retrieve(response.id).output_text == response.output_text  # GET by id, keyed
    follow = client.responses.create(
        model=MODEL, input="And another?", previous_response_id=response.id, max_output_tokens=8, temperature=0
    )
    assert follow.output_text and follow.previous_response_id == response.id


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
def test_the_answer_text_the_gateway_records_is_vllms_answer(keyed_gateway: tuple[Gateway, str], path: str) -> None:
    # The text a prefix policy records as the conversation's next prefix (gateway.request.usage), read from real
    # vLLM's Anthropic and Responses answers, whole and streamed, as relayed: equal to the answer the client reads.
    gw, _ = keyed_gateway
    if path == "/v1/messages":
        body = {
            "model": MODEL,
            "max_tokens": 12,
            "temperature": 0,
            "messages": [{"role": "user", "content": "Name a colour."}],
        }
    else:
        body = {"model": MODEL, "max_output_tokens": 12, "temperature": 0, "input": "Name a colour."}
    whole = httpx.post(f"{gw.url}{path}", json=body, timeout=120)
    assert whole.status_code == 200, whole.text
    if path == "/v1/messages":
        said = "".join(block["text"] for block in whole.json()["content"] if block["type"] == "text")
    else:
        said = "".join(
            part["text"] for item in whole.json()["output"] if item["type"] == "message" for part in item["content"]
        )
    assert said
    read = Usage(answer=[])
    read.read_body(whole.content)
    assert "".join(read.answer or []) == said and read.completion_tokens
    streamed = httpx.post(f"{gw.url}{path}", json={**body, "stream": True}, timeout=120)
    assert streamed.status_code == 200, streamed.text
    scanned = Usage(answer=[])
    scanner = SSEUsageScanner(scanned)
    for i in range(0, len(streamed.content), 97):  # split anywhere, as the relay's chunks may be
        scanner.feed(streamed.content[i : i + 97])
    scanner.flush()
    assert "".join(scanned.answer or []) == said  # greedy: the same answer streamed or not


def test_the_backend_key_is_in_no_admin_answer_nor_log(keyed_gateway: tuple[Gateway, str]) -> None:
    gw, _ = keyed_gateway
    for answer in (httpx.get(f"{gw.url}/admin/replicas", timeout=10), httpx.get(f"{gw.url}/metrics", timeout=10)):
        assert answer.status_code == 200 and BACKEND_KEY not in answer.text
    log = gw.proc.output()
    assert '"event"' in log and BACKEND_KEY not in log  # the log was written, without the key
