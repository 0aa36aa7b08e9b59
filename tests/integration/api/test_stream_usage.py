"""Usage on every stream, through a real gateway to a real stub: a client that streams without
`include_usage` sees no usage event, and the gateway's tenant token counter still moves by exactly
the replica's own count of generated tokens."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from gateway.edge.auth import hash_key
from tests.integration.gateway_procs import MODEL, pool, running, start_gateway, start_stub
from tests.integration.reliability_tools import metric

pytestmark = pytest.mark.timeout(60)
KEY = "tenant-key"
COMPLETION = 'affinity_gateway_tenant_tokens_total{kind="completion",tenant="acme"}'


def stub_generated(url: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines()
        if line.startswith("vllm:generation_tokens_total")
    )


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_stream_without_include_usage_is_counted_and_shows_no_usage(tmp_path: Path, endpoint: str) -> None:
    with running() as track:
        stub = track(start_stub("s-0"))
        gateway = track(
            start_gateway(
                tmp_path, {MODEL: pool(("s-0", stub.url))}, auth={"keys": [{"sha256": hash_key(KEY), "tenant": "acme"}]}
            )
        )
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0, timeout=20)
        before = stub_generated(stub.url)
        for _ in range(3):
            if endpoint == "chat":
                chunks = list(
                    client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "count to five"}], max_tokens=6, stream=True
                    )
                )
            else:
                chunks = list(client.completions.create(model=MODEL, prompt="count to five", max_tokens=6, stream=True))
            assert chunks and all(c.usage is None for c in chunks)  # nothing the client did not ask for
            assert all(c.choices for c in chunks) and chunks[-1].choices[0].finish_reason is not None
        generated = stub_generated(stub.url) - before
        assert generated > 0 and metric(gateway, COMPLETION) == generated


def test_stream_usage_false_leaves_the_body_as_sent_and_asked_usage_still_arrives(tmp_path: Path) -> None:
    with running() as track:
        stub = track(start_stub("s-0"))
        gateway = track(
            start_gateway(
                tmp_path,
                {MODEL: {**pool(("s-0", stub.url)), "stream_usage": False}},
                auth={"keys": [{"sha256": hash_key(KEY), "tenant": "acme"}]},
            )
        )
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0, timeout=20)
        messages = [{"role": "user", "content": "hi"}]
        list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, stream=True))
        assert not metric(gateway, COMPLETION)  # not asked for: the counts never came
        asked = list(
            client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=3, stream=True, stream_options={"include_usage": True}
            )
        )
        assert asked[-1].usage is not None and asked[-1].choices == []  # the client's own usage is its own
        assert metric(gateway, COMPLETION) == asked[-1].usage.completion_tokens
