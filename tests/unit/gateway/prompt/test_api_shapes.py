"""Prefix keys of the Anthropic Messages and Responses bodies: the conversation they carry keys like chat."""

from __future__ import annotations

import pytest

from gateway.config.features import RoutesConfig
from gateway.errors import ConfigError
from gateway.prompt.prefix_keys import prompt_source
from gateway.request.usage import Usage

pytestmark = pytest.mark.timeout(30)
TOOLS = [{"name": "lookup", "description": "find a drawer", "input_schema": {"type": "object"}}]


def test_messages_and_responses_key_like_the_same_chat() -> None:
    chat = prompt_source(
        "chat",
        {
            "tools": TOOLS,
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is 1907?"}],
        },
    )
    messages = prompt_source(
        "messages",
        {
            "tools": TOOLS,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [{"role": "user", "content": "Where is 1907?"}],
        },
    )
    responses = prompt_source(
        "responses",
        {
            "tools": TOOLS,
            "instructions": "Be brief.",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Where is 1907?"}]}],
        },
    )
    assert chat == messages == responses
    assert chat[1] == len(chat[0]) - len("Where is 1907?") - len(
        prompt_source("chat", {"messages": [{"role": "user", "content": ""}]})[0]
    )  # the preamble: tools + system


def test_a_later_turn_extends_the_earlier_key() -> None:
    first = {"instructions": "Be brief.", "input": "Where is 1907?"}
    later = {
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "Where is 1907?"},
            {"type": "function_call", "name": "lookup", "arguments": "{}"},
        ],
    }
    assert str(prompt_source("responses", later)[0]).startswith(str(prompt_source("responses", first)[0]))


def test_other_apis_usage_is_counted() -> None:
    usage = Usage()
    usage.read_body(
        b'{"type":"message_start","message":{"usage":{"input_tokens":40,"output_tokens":0,'
        b'"cache_read_input_tokens":32}}}'
    )
    usage.read_body(b'{"type":"message_delta","usage":{"output_tokens":7}}')
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (40, 7, 32)
    usage = Usage()
    usage.read_body(
        b'{"type":"response.completed","response":{"usage":{"input_tokens":9,'
        b'"input_tokens_details":{"cached_tokens":4},"output_tokens":3}}}'
    )
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (9, 3, 4)


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        (["v1/x"], "expected a path"),
        (["/v1/chat/completions"], "already a gateway route"),
        (["/admin/x"], "already a gateway route"),
        (["/v1/x", "/v1/x"], "listed twice"),
    ],
)
def test_passthrough_paths_are_validated(paths: list[str], message: str) -> None:
    from gateway.config import schema

    with pytest.raises(ConfigError) as err:
        schema.build(RoutesConfig, {"passthrough": paths}, "routes")
    assert message in err.value.reason and err.value.key.startswith("routes.passthrough[")
