"""Prefix hashing: chain property across chat turns, canonical tools, salts, token ids."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import schema
from gateway.config.pools import PrefixConfig
from gateway.errors import ConfigError
from gateway.prompt import prefix_keys as prefix
from gateway.view import RequestView

P = PrefixConfig()
SYSTEM = "You are a careful assistant. Answer briefly and cite sources. " * 8


def view(body: dict[str, Any], endpoint: str = "chat", model: str = "m", tenant: str | None = None) -> RequestView:
    return RequestView("r1", endpoint, model, False, body, b"", tenant=tenant)


def hashes(body: dict[str, Any], params: PrefixConfig = P, **kw: Any) -> tuple[int, ...]:
    return prefix.compute(view(body, **kw), params).block_hashes


def turn(n: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for i in range(n):
        msgs.append({"role": "user", "content": f"question {i}: " + "why is the sky blue? " * 5})
        msgs.append({"role": "assistant", "content": f"answer {i}: " + "Rayleigh scattering. " * 6})
    msgs.append({"role": "user", "content": f"question {n}: and at sunset?"})
    return msgs


def test_next_turn_starts_with_previous_turns_hashes() -> None:
    for n in range(4):
        first, second = hashes({"messages": turn(n)}), hashes({"messages": turn(n + 1)})
        # Turn n's full blocks, except a last one that straddles its final user message, recur.
        assert len(second) > len(first)
        common = len(prefix.render_chat({"messages": turn(n)[:-1]})[0]) // P.block_chars
        assert first[:common] == second[:common] and common > 0


def test_rendering_of_turn_is_a_prefix_of_the_next() -> None:
    body_n = {"messages": turn(2)[:-1]}
    body_next = {"messages": turn(3)}
    assert prefix.render_chat(body_next)[0].startswith(prefix.render_chat(body_n)[0])


def test_preamble_is_tools_and_leading_system_messages() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    msgs = turn(1)
    text, preamble = prefix.render_chat({"tools": tools, "messages": msgs})
    assert text[:preamble].endswith(SYSTEM) and text[preamble:].startswith("\x1euser")
    result = prefix.compute(view({"tools": tools, "messages": msgs}), P)
    inside = preamble // P.block_chars  # blocks wholly inside the preamble
    assert result.preamble_tokens == inside * P.tokens_per_block > 0
    assert result.preamble_key == result.block_hashes[inside - 1]
    only_system = {"messages": [{"role": "system", "content": SYSTEM}]}
    assert prefix.render_chat(only_system)[1] == len(prefix.render_chat(only_system)[0])
    assert prefix.compute(view({"prompt": SYSTEM}, endpoint="completions"), P).preamble_tokens == 0


def test_only_full_blocks_are_hashed() -> None:
    text = "x" * (3 * P.block_chars + 10)
    assert len(hashes({"prompt": text}, endpoint="completions")) == 3
    assert hashes({"prompt": "short"}, endpoint="completions") == ()


def test_chain_names_the_whole_prefix() -> None:
    a = "A" * P.block_chars + "B" * P.block_chars
    b = "C" * P.block_chars + "B" * P.block_chars
    ha, hb = hashes({"prompt": a}, endpoint="completions"), hashes({"prompt": b}, endpoint="completions")
    assert ha[1] != hb[1]  # same block text, different parent


def test_content_parts_hash_like_plain_text() -> None:
    plain = {"messages": [{"role": "user", "content": SYSTEM}]}
    parts = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": SYSTEM[:100]}, {"type": "text", "text": SYSTEM[100:]}],
            }
        ]
    }
    assert hashes(plain) == hashes(parts) != ()


def test_images_key_the_prefix() -> None:
    def body(url: str) -> dict[str, Any]:
        return {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": SYSTEM}],
                }
            ]
        }

    assert hashes(body("http://a/1.png"))[0] != hashes(body("http://a/2.png"))[0]


def test_tools_render_first_and_canonically() -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}},
        },
    }
    reordered = {
        "function": {
            "parameters": {"properties": {"unit": {"type": "string"}, "city": {"type": "string"}}, "type": "object"},
            "name": "get_weather",
        },
        "type": "function",
    }
    msgs = turn(1)
    assert hashes({"tools": [tool], "messages": msgs}) == hashes({"tools": [reordered], "messages": msgs})
    other = {**tool, "function": {**tool["function"], "name": "get_time"}}
    assert hashes({"tools": [tool], "messages": msgs})[0] != hashes({"tools": [other], "messages": msgs})[0]
    text, preamble = prefix.render_chat({"tools": [tool], "messages": msgs})
    assert text.index("get_weather") < text.index(SYSTEM[:20]) < preamble


def test_tool_calls_are_part_of_the_prefix() -> None:
    def body(args: str) -> dict[str, Any]:
        return {
            "messages": [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": SYSTEM},
            ]
        }

    assert hashes(body('{"city": "Paris"}')) != hashes(body('{"city": "Rome"}'))


def test_roles_are_part_of_the_prefix() -> None:
    assert hashes({"messages": [{"role": "user", "content": SYSTEM}]}) != hashes(
        {"messages": [{"role": "system", "content": SYSTEM}]}
    )


@pytest.mark.parametrize("salt_by_tenant,shared", [(False, True), (True, False)], ids=["unsalted", "salted"])
def test_tenant_salt(salt_by_tenant: bool, shared: bool) -> None:
    params = PrefixConfig(salt_by_tenant=salt_by_tenant)
    a = hashes({"messages": turn(1)}, params, tenant="acme")
    b = hashes({"messages": turn(1)}, params, tenant="globex")
    assert (a == b) is shared
    if not shared:
        assert not set(a) & set(b)
    assert a == hashes({"messages": turn(1)}, params, tenant="acme")


def test_model_and_cache_salt_seed_the_chain() -> None:
    body = {"messages": turn(1)}
    assert hashes(body, model="a")[0] != hashes(body, model="b")[0]
    assert hashes(body)[0] != hashes({**body, "cache_salt": "s"})[0]


def test_token_ids_hash_in_token_blocks() -> None:
    ids = list(range(100))
    result = prefix.compute(view({"prompt": ids}, endpoint="completions"), P)
    assert len(result.block_hashes) == 100 // P.block
    assert result.prompt_tokens == 100 and result.tokens_per_block == P.block
    batch = prefix.compute(view({"prompt": [ids, [1, 2]]}, endpoint="completions"), P)
    assert batch.block_hashes == result.block_hashes
    bad = prefix.compute(view({"prompt": [1, 2, -5] + [1] * 20}, endpoint="completions"), P)
    assert bad.block_hashes == ()


def test_batch_of_strings_routes_by_the_first() -> None:
    text = SYSTEM
    first_of_two = hashes({"prompt": [text, "other"]}, endpoint="completions")
    assert first_of_two == hashes({"prompt": text}, endpoint="completions")


@pytest.mark.parametrize("body", [{}, {"prompt": 5}, {"prompt": []}, {"prompt": None}], ids=str)
def test_odd_completions_give_no_blocks(body: dict[str, Any]) -> None:
    assert hashes(body, endpoint="completions") == ()


def test_odd_chat_bodies_do_not_crash() -> None:
    assert hashes({"messages": "nope"}) == ()
    assert hashes({"messages": [5, {"role": "user", "content": {"a": SYSTEM}}]}) != ()


def test_non_ascii_text_hashes_by_characters() -> None:
    text = "héllo wörld ✓ " * 40
    h = hashes({"prompt": text}, endpoint="completions")
    assert len(h) == len(text) // P.block_chars
    assert h == hashes({"prompt": text + "more"}, endpoint="completions")[: len(h)]


def test_prompt_token_estimate() -> None:
    result = prefix.compute(view({"prompt": "x" * 400}, endpoint="completions"), P)
    assert result.prompt_tokens == 100


def test_max_blocks_bounds_the_work() -> None:
    params = PrefixConfig(max_blocks=3)
    assert len(hashes({"prompt": "y" * 10_000}, params, endpoint="completions")) == 3


@pytest.mark.parametrize(
    "data,key",
    [({"block_chars": 0}, "p.block_chars"), ({"chars_per_token": 0}, "p.chars_per_token"), ({"bogus": 1}, "p.bogus")],
    ids=["block", "cpt", "unknown"],
)
def test_params_validation_names_the_key(data: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        schema.build(PrefixConfig, data, "p")
    assert err.value.key == key


@pytest.mark.parametrize("n", [0, 1, 3])
def test_with_answer_equals_the_next_turns_chain(n: int) -> None:
    messages = turn(n)
    answer = "The sky turns red at sunset because light crosses more air. " * 3
    now = view({"messages": messages})
    now.block_hashes = prefix.compute(now, P).block_hashes
    nxt = hashes(
        {"messages": [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": "thanks"}]}
    )
    extended = prefix.with_answer(now, P, answer)
    assert len(extended) > len(now.block_hashes)
    assert nxt[: len(extended)] == extended


def test_with_answer_equals_the_next_turns_chain_on_anthropic_messages() -> None:
    # The next turn as the Anthropic SDK sends it back: the answer's content blocks as the assistant turn.
    messages = [{"role": "user", "content": "why is the sky blue? " * 8}]
    answer = "Rayleigh scattering favours the short wavelengths. " * 4
    now = view({"system": SYSTEM, "messages": messages}, endpoint="messages")
    now.block_hashes = prefix.compute(now, P).block_hashes
    said = {"role": "assistant", "content": [{"type": "text", "text": answer}]}
    nxt = hashes(
        {"system": SYSTEM, "messages": [*messages, said, {"role": "user", "content": "thanks"}]}, endpoint="messages"
    )
    extended = prefix.with_answer(now, P, answer)
    assert len(extended) > len(now.block_hashes)
    assert nxt[: len(extended)] == extended


@pytest.mark.parametrize("first_input", ["why is the sky blue? " * 8, [{"role": "user", "content": "why? " * 30}]])
def test_with_answer_equals_the_next_turns_chain_on_the_responses_api(first_input: Any) -> None:
    # The next turn carries the earlier output message in `input`, as a client without stored responses does.
    answer = "Rayleigh scattering favours the short wavelengths. " * 4
    now = view({"instructions": SYSTEM, "input": first_input}, endpoint="responses")
    now.block_hashes = prefix.compute(now, P).block_hashes
    earlier = [{"role": "user", "content": first_input}] if isinstance(first_input, str) else first_input
    output = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]}
    nxt = hashes(
        {"instructions": SYSTEM, "input": [*earlier, output, {"role": "user", "content": "thanks"}]},
        endpoint="responses",
    )
    extended = prefix.with_answer(now, P, answer)
    assert len(extended) > len(now.block_hashes)
    assert nxt[: len(extended)] == extended


def test_with_answer_for_completions_appends_the_text() -> None:
    prompt = "Once upon a time, " * 20
    now = view({"prompt": prompt}, endpoint="completions")
    now.block_hashes = prefix.compute(now, P).block_hashes
    extended = prefix.with_answer(now, P, "there was a gateway. " * 10)
    assert extended == hashes({"prompt": prompt + "there was a gateway. " * 10}, endpoint="completions")


def test_embeddings_key_by_their_input_and_audio_uploads_by_nothing() -> None:
    from gateway.prompt.prefix_keys import prompt_source

    assert prompt_source("embeddings", {"input": "a shared document"}) == ("a shared document", 0)
    assert prompt_source("embeddings", {"input": ["first of a batch", "second"]}) == ("first of a batch", 0)
    assert prompt_source("audio", {"model": "w", "prompt": "a decoder hint"}) == ("", 0)
