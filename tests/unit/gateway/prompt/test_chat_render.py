"""Chat rendering as vLLM renders it: content parts, the developer role, and the warm-up that keeps
the first compile out of a request's tokenize budget. (Token for token against vLLM itself:
tests/vllm/test_vllm_chat_render.py.)"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from gateway.prompt.chat_render import vllm_conversation
from gateway.prompt.tokenizers import HFPromptTokenizer, build_prompt_tokenizer
from tests.e2e.real_replica import require_model

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def tok() -> HFPromptTokenizer:
    require_model()
    built = build_prompt_tokenizer("model:smollm2")
    assert isinstance(built, HFPromptTokenizer)
    return built


def ids(tok: HFPromptTokenizer, messages: list[dict[str, Any]]) -> list[int]:
    out = tok.encode("chat", {"messages": messages})
    assert out is not None
    return list(out.token_ids)


def test_content_parts_join_with_a_newline(tok: HFPromptTokenizer) -> None:
    parts = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "first part"},
                {"type": "image_url"},
                {"type": "text", "text": "second part"},
            ],
        }
    ]
    assert ids(tok, parts) == ids(tok, [{"role": "user", "content": "first part\nsecond part"}])


def test_developer_renders_as_one_merged_system_message(tok: HFPromptTokenizer) -> None:
    developer = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "developer", "content": "Answer in French."},
    ]
    merged = [{"role": "system", "content": "Be brief.\n\nAnswer in French."}, {"role": "user", "content": "Hi"}]
    assert ids(tok, developer) == ids(tok, merged)


def test_a_template_that_knows_developer_keeps_it() -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "developer", "content": "x"}]
    assert vllm_conversation(messages, "{% if m.role == 'developer' %}") == messages
    assert vllm_conversation(messages, "plain") == [
        {"role": "system", "content": "x"},
        {"role": "user", "content": "Hi"},
    ]
    lone = [{"role": "developer", "content": "x", "tools": []}, {"role": "user", "content": "Hi"}]
    assert vllm_conversation(lone, "plain") == [{"role": "system", "content": "x"}, {"role": "user", "content": "Hi"}]


FIRST_REQUEST = """
import asyncio
from gateway.prompt import tokenizers
from gateway.prompt.prompt_keys import PromptKeys

compiled = []
compile_template = tokenizers.compile_template
tokenizers.compile_template = lambda source: compiled.append(source) or compile_template(source)

async def main():
    keys = PromptKeys(tokenizers.build_prompt_tokenizer("model:smollm2"), budget_s=5.0)
    await asyncio.get_running_loop().run_in_executor(keys._executor, lambda: None)  # the gateway starting up
    warmed = len(compiled)
    body = {"messages": [{"role": "user", "content": "The first question of a fresh gateway."}]}
    encoded = await keys.encode("chat", body) is not None
    print(f"warm-up compiled {warmed}, the first request {len(compiled) - warmed}, encoded {encoded}")
    await keys.close()

asyncio.run(main())
"""


def test_the_first_request_does_not_pay_the_template_compile() -> None:
    """The template is compiled by the warm-up queued first on the tokenizer's worker, not on the first request's
    encode. Counted, not timed: on a virtual machine, work on memory left idle for a few seconds (a gateway
    starting up) can take as long as the compile itself (tens of milliseconds)."""
    require_model()  # a fresh process: nothing compiled or imported by earlier tests
    out = subprocess.run([sys.executable, "-c", FIRST_REQUEST], capture_output=True, text=True, timeout=50)
    assert out.stdout.strip() == "warm-up compiled 1, the first request 0, encoded True", out.stderr[-2000:]
