from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.prompt.sim_tokens import IM_END, IM_START, apply_chat_template, piece_id
from replica_stub.engine.simulated import WORDS
from replica_stub.tokenizer import SimTokenizer

TEXTS = [
    "",
    "hello",
    "hello world ",
    "  leading spaces",
    "internationalization!",
    "a\n\nb\tc",
    f"{IM_START}user\nhi{IM_END}\n",
    "<|im_startx|> not special",
    "emoji 🙂 ok",
    "trailing   ",
]


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_round_trip(text: str) -> None:
    tok = SimTokenizer()
    assert tok.decode(tok.encode(text), skip_special_tokens=False) == text


@given(st.text())
def test_round_trip_any_text(text: str) -> None:
    tok = SimTokenizer()
    assert tok.decode(tok.encode(text), skip_special_tokens=False) == text


def test_ids_are_stable_across_instances() -> None:
    assert SimTokenizer().encode("the same words") == SimTokenizer().encode("the same words")
    assert SimTokenizer().eos_token_id == piece_id(IM_END)


def test_long_words_are_split_in_short_runs() -> None:
    pieces = SimTokenizer().pieces("internationalization rocks")
    assert pieces == ["internat", "ionaliza", "tion ", "rocks"]


def test_special_tokens_are_single_pieces_and_skipped_on_decode() -> None:
    tok = SimTokenizer()
    ids = tok.encode(f"{IM_START}user\nhi{IM_END}")
    assert ids[0] == piece_id(IM_START) and ids[-1] == tok.eos_token_id
    assert tok.decode(ids) == "user\nhi"


@given(st.lists(st.sampled_from(WORDS), min_size=1, max_size=20), st.text(max_size=30))
def test_generated_words_are_prefix_stable(words: list[str], tail: str) -> None:
    """A prompt plus generated words re-tokenizes to prompt ids + generated ids, whatever follows."""
    tok = SimTokenizer(w + " " for w in WORDS)
    prompt = apply_chat_template([{"role": "user", "content": "question?"}])
    generated = [tok.encode(w + " ")[0] for w in words]
    answer = tok.decode(generated)
    follow_up = apply_chat_template(
        [
            {"role": "user", "content": "question?"},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": tail},
        ]
    )
    ids = tok.encode(follow_up)
    expected = tok.encode(prompt) + generated + [tok.eos_token_id]
    assert ids[: len(expected)] == expected


def test_chat_template_renders_messages_in_order() -> None:
    text = apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "U"}]}]
    )
    assert text == f"{IM_START}system\nS{IM_END}\n{IM_START}user\nU{IM_END}\n{IM_START}assistant\n"
