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
from gateway.prompt.prompt_keys import PromptKeys
from gateway.prompt.tokenizers import build_prompt_tokenizer

async def main():
    keys = PromptKeys(build_prompt_tokenizer("model:smollm2"), budget_s=0.01)  # the compile alone takes ~40 ms
    await asyncio.sleep(3.0)  # the gateway starting up: the warm-up runs meanwhile (a loaded machine: seconds)
    body = {"messages": [{"role": "user", "content": "The first question of a fresh gateway."}]}
    print("within budget" if await keys.encode("chat", body) is not None else "over budget")
    await keys.close()

asyncio.run(main())
"""


def test_the_first_request_does_not_pay_the_template_compile() -> None:
    require_model()  # a fresh process: nothing compiled or imported by earlier tests
    out = subprocess.run([sys.executable, "-c", FIRST_REQUEST], capture_output=True, text=True, timeout=50)
    assert out.stdout.strip() == "within budget", out.stderr[-2000:]
