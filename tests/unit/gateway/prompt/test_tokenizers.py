"""Token-exact prompts: equal to the replicas' own tokenization, from scratch and incrementally."""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.errors import ConfigError
from gateway.prompt.sim_tokens import apply_chat_template
from gateway.prompt.tokenized import TokenizedPrompt
from gateway.prompt.tokenizers import (
    HFPromptTokenizer,
    PromptTokenizer,
    SimPromptTokenizer,
    _prefix_keys,
    build_prompt_tokenizer,
)
from replica_stub.tokenizer import SimTokenizer
from tests.e2e.real_replica import require_model

pytestmark = pytest.mark.timeout(120)

WORDS = [
    "the",
    "sky",
    "is",
    "blue",
    "héllo",
    "🙂🙂",
    "naïve",
    "日本語",
    "<|im_end|>",
    "<|im_start|>",
    "a\n\n",
    "  ",
    "\t",
    "",
    "don't",
    "x" * 19,
    "12345",
    "😀 ok",
    "\u200b",
    "end.",
    "ﬁ",
]


def conversation(rng: random.Random, turns: int, system: bool = True) -> list[dict[str, Any]]:
    """A conversation whose contents join inside words, carry unicode, specials and empty strings."""

    def text() -> str:
        return "".join(rng.choice(WORDS) + rng.choice(["", " ", "\n"]) for _ in range(rng.randint(0, 30)))

    msgs: list[dict[str, Any]] = [{"role": "system", "content": text()}] if system else []
    for i in range(turns):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": text()})
    return msgs


def sim_ids(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
    return SimTokenizer().encode(apply_chat_template(messages, add_generation_prompt=add_generation_prompt))


# --- simulator -------------------------------------------------------------------------------------------------


def test_sim_chat_equals_the_stub() -> None:
    rng = random.Random(1)
    for seed in range(40):
        msgs = conversation(rng, seed % 7 + 1, system=seed % 2 == 0)
        out = SimPromptTokenizer().encode("chat", {"messages": msgs})
        assert out is not None and list(out.token_ids) == sim_ids(msgs)
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "a b"}, {"type": "image_url"}, {"type": "text", "text": "c"}],
        }
    ]
    assert list(SimPromptTokenizer().encode("chat", {"messages": parts}).token_ids) == sim_ids(parts)  # type: ignore[union-attr]
    none = [{"role": "assistant", "content": None}, {"role": "user", "content": ""}]
    assert list(SimPromptTokenizer().encode("chat", {"messages": none}).token_ids) == sim_ids(none)  # type: ignore[union-attr]


def test_sim_preamble_and_generation_prompt() -> None:
    tok = SimPromptTokenizer()
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "developer", "content": "x y"},
        {"role": "user", "content": "hi"},
    ]
    out = tok.encode("chat", {"messages": msgs})
    assert out is not None and out.preamble_tokens == len(sim_ids(msgs[:2], add_generation_prompt=False))
    assert tok.encode("chat", {"messages": msgs[2:]}).preamble_tokens == 0  # type: ignore[union-attr]
    no_gen = tok.encode("chat", {"messages": msgs, "add_generation_prompt": False})
    assert no_gen is not None and list(no_gen.token_ids) == sim_ids(msgs, add_generation_prompt=False)


def test_completions_and_other_shapes() -> None:
    tok = SimPromptTokenizer()
    prompt = "Once upon a time, héllo <|im_end|> world"
    assert tok.encode("completions", {"prompt": prompt}) == TokenizedPrompt(tuple(SimTokenizer().encode(prompt)), 0)
    assert tok.encode("completions", {"prompt": [prompt, "other"]}).token_ids == tuple(  # type: ignore[union-attr]
        SimTokenizer().encode(prompt)
    )
    assert tok.encode("completions", {"prompt": [5, 6, 7]}) == TokenizedPrompt((5, 6, 7), 0)
    assert tok.encode("completions", {"prompt": [[1, 2], [3]]}) == TokenizedPrompt((1, 2), 0)
    for endpoint, body in [
        ("completions", {"prompt": [1.5]}),
        ("completions", {}),
        ("embeddings", {"input": "x"}),
        ("chat", {"messages": []}),
        ("chat", {"messages": [{"content": "no role"}]}),
        ("chat", {"messages": [{"role": "user", "content": 3}]}),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "continue_final_message": True}),
    ]:
        assert tok.encode(endpoint, body) is None


def test_sim_never_remembers_pieces() -> None:
    tok = SimPromptTokenizer()
    tok.encode("completions", {"prompt": " ".join(f"w{i}" for i in range(1000))})
    assert not any(isinstance(v, dict) and len(v) > 100 for v in vars(tok).values())


# --- incremental cache ------------------------------------------------------------------------------------------


def grow_and_compare(tok: PromptTokenizer, scratch: PromptTokenizer, msgs: list[dict[str, Any]]) -> None:
    """Each prefix of the conversation, as successive turns, encodes as a cold tokenizer does."""
    for n in range(1, len(msgs) + 1):
        body = {"messages": msgs[:n]}
        scratch._cache.clear()
        assert tok.encode("chat", body) == scratch.encode("chat", body)


def test_sim_incremental_equals_scratch_and_hits() -> None:
    tok, rng = SimPromptTokenizer(), random.Random(7)
    msgs = conversation(rng, 10)
    grow_and_compare(tok, SimPromptTokenizer(), msgs)
    assert tok.cache_hits >= 10  # every turn after the first reuses the previous one


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(alphabet=st.sampled_from(list("ab é🙂<|>_imstrend\n ")), max_size=40), min_size=1, max_size=6))
def test_sim_incremental_property(contents: list[str]) -> None:
    msgs = [{"role": ["system", "user", "assistant"][min(i, 1 + i % 2)], "content": c} for i, c in enumerate(contents)]
    tok = SimPromptTokenizer()
    for n in range(1, len(msgs) + 1):
        assert list(tok.encode("chat", {"messages": msgs[:n]}).token_ids) == sim_ids(msgs[:n])  # type: ignore[union-attr]


def test_cache_is_bounded() -> None:
    tok = SimPromptTokenizer(max_entries=3)
    for i in range(10):
        tok.encode("chat", {"messages": [{"role": "user", "content": f"conversation {i}"}]})
    assert len(tok._cache) == 3
    small = SimPromptTokenizer(max_cached_tokens=20)
    for i in range(10):
        small.encode("chat", {"messages": [{"role": "user", "content": f"conversation {i} " * 5}]})
    assert small._cached_tokens <= 20


# --- Hugging Face model folder ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_folder() -> Path:
    require_model()
    from gateway.prompt.model_cache import converted_dir
    from replica_stub.engine.model import load_model

    if not (converted_dir() / "tokenizer.json").is_file():
        load_model()  # converts the GGUF once
    return converted_dir()


@pytest.fixture(scope="module")
def hf(model_folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_folder)


def hf_ids(hf: Any, messages: list[dict[str, Any]], **kw: Any) -> list[int]:
    out = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kw)
    return list(out if isinstance(out, list) else out["input_ids"])


@pytest.mark.model
def test_hf_equals_transformers_and_the_stub(model_folder: Path, hf: Any) -> None:
    from replica_stub.engine.model import HFTokenizer

    stub = HFTokenizer(hf)
    tok, rng = build_prompt_tokenizer("model:smollm2"), random.Random(3)
    for seed in range(25):
        msgs = conversation(rng, seed % 6 + 1, system=seed % 3 != 0)
        out = tok.encode("chat", {"messages": msgs})
        assert out is not None
        assert list(out.token_ids) == hf_ids(hf, msgs) == stub.encode(stub.apply_chat_template(msgs))
        if msgs[0]["role"] == "system":
            assert out.preamble_tokens == len(hf.apply_chat_template(msgs[:1], tokenize=True)["input_ids"])
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    msgs = conversation(rng, 3)
    assert list(tok.encode("chat", {"messages": msgs, "tools": tools}).token_ids) == hf_ids(  # type: ignore[union-attr]
        hf, msgs, tools=tools
    )
    for prompt in ["Once upon a time", " leading space héllo 🙂", "<|im_start|>user\nhi<|im_end|>", ""]:
        assert list(tok.encode("completions", {"prompt": prompt}).token_ids) == stub.encode(prompt)  # type: ignore[union-attr]


@pytest.mark.model
def test_a_gguf_file_gives_the_same_tokens_as_the_converted_model(
    model_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replica_stub.engine.model import gguf_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    gguf = gguf_path()
    assert gguf is not None
    from_gguf, converted = build_prompt_tokenizer(str(gguf)), build_prompt_tokenizer("model:smollm2")
    rng = random.Random(5)
    for seed in range(5):
        body = {"messages": conversation(rng, seed + 1)}
        assert from_gguf.encode("chat", body) == converted.encode("chat", body)
    assert list((tmp_path / "affinity-gateway" / "tokenizers").iterdir())  # written once, reused next time


TEMPLATE = """{%- set ns = namespace(n=0) -%}
{%- if tools %}<|im_start|>system
Tools: {{ tools | tojson }}<|im_end|>
{% endif -%}
{% for message in messages %}
  {%- if message['role'] == 'bad' %}{{ raise_exception('bad role') }}{% endif -%}
  {%- set ns.n = ns.n + 1 -%}
<|im_start|>{{ message['role'] }}
{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim }}{% endgeneration %}
{% else %}{{ message['content'] }}{% endif %}{{ eos_token }}
{% endfor -%}
{% if add_generation_prompt %}<|im_start|>assistant{{ ' think' if enable_thinking else '' }}
{% endif %}"""


@pytest.mark.model
def test_hf_renders_a_custom_template_as_transformers(model_folder: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_folder / name, tmp_path / name)
    (tmp_path / "chat_template.jinja").write_text(TEMPLATE)
    hf, tok = AutoTokenizer.from_pretrained(tmp_path), build_prompt_tokenizer(str(tmp_path / "tokenizer.json"))
    tools = [{"type": "function", "function": {"name": "é", "description": "<b>&"}}]
    msgs = conversation(random.Random(5), 4)
    for kwargs in ({}, {"enable_thinking": True}):
        body = {"messages": msgs, "tools": tools, "chat_template_kwargs": kwargs}
        assert list(tok.encode("chat", body).token_ids) == hf_ids(hf, msgs, tools=tools, **kwargs)  # type: ignore[union-attr]
    with pytest.raises(Exception, match="bad role"):
        tok.encode("chat", {"messages": [{"role": "bad", "content": "x"}]})


@pytest.mark.model
def test_hf_incremental_equals_scratch_and_hits(model_folder: Path) -> None:
    tok, scratch, rng = HFPromptTokenizer(model_folder), HFPromptTokenizer(model_folder), random.Random(11)
    for _ in range(5):
        grow_and_compare(tok, scratch, conversation(rng, 10))
    assert tok.cache_hits >= 5 * 10


@pytest.fixture(scope="module")
def hf_tok(model_folder: Path) -> HFPromptTokenizer:
    return HFPromptTokenizer(model_folder)


@pytest.mark.model
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.text(alphabet=st.sampled_from(list("ab é🙂日<|>_imstrend'sl09\n \t")), max_size=40), min_size=1, max_size=6
    )
)
def test_hf_incremental_property(hf_tok: HFPromptTokenizer, contents: list[str]) -> None:
    msgs = [{"role": ["system", "user", "assistant"][min(i, 1 + i % 2)], "content": c} for i, c in enumerate(contents)]
    for n in range(1, len(msgs) + 1):
        text = hf_tok.render(msgs[:n], tools=None, add_generation_prompt=True, kwargs={})
        scratch = hf_tok._tok.encode(text, add_special_tokens=False).ids
        assert list(hf_tok.encode("chat", {"messages": msgs[:n]}).token_ids) == scratch  # type: ignore[union-attr]


@pytest.mark.model
def test_hf_encode_timing(model_folder: Path) -> None:
    """Not a timed assertion: prints from-scratch vs incremental cost for an ~8k-token chat (`-s` shows it)."""
    tok, scratch = HFPromptTokenizer(model_folder), HFPromptTokenizer(model_folder)
    rng, words = random.Random(2), ["the", "sky", "is", "blue", "über", "naïve", "cache", "token"]
    msgs = [{"role": "system", "content": "You are a careful assistant. " * 40}]
    while True:
        msgs += [
            {"role": "user", "content": " ".join(rng.choice(words) for _ in range(300))},
            {"role": "assistant", "content": " ".join(rng.choice(words) for _ in range(300))},
        ]
        out = tok.encode("chat", {"messages": msgs})
        if out is not None and len(out.token_ids) >= 8000:
            break
    msgs.append({"role": "user", "content": "one more question " * 20})
    own_entry = _prefix_keys(msgs, None, {})[-1]
    runs = 20
    t0 = time.perf_counter()
    for _ in range(runs):
        scratch._cache.clear()
        cold = scratch.encode("chat", {"messages": msgs})
    t1 = time.perf_counter()
    for _ in range(runs):
        warm = tok.encode("chat", {"messages": msgs})  # the previous turn is cached...
        tok._cache.pop(own_entry)  # ...but not this one
    t2 = time.perf_counter()
    assert cold == warm and cold is not None
    print(
        f"\n{len(cold.token_ids)} tokens: from scratch {(t1 - t0) / runs * 1e3:.2f} ms, "
        f"incremental {(t2 - t1) / runs * 1e3:.2f} ms"
    )


# --- building and the async wrapper ------------------------------------------------------------------------------


def test_build_prompt_tokenizer_errors(tmp_path: Path) -> None:
    assert isinstance(build_prompt_tokenizer("sim"), SimPromptTokenizer)
    with pytest.raises(ConfigError, match="no such file") as missing:
        build_prompt_tokenizer(str(tmp_path / "nope"), key="pools.a.routing.tokenizer")
    assert missing.value.key == "pools.a.routing.tokenizer"
    with pytest.raises(ConfigError, match="no tokenizer.json"):
        build_prompt_tokenizer(str(tmp_path))
