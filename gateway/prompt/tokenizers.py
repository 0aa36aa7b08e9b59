"""Token-exact prompts: the ids a replica's engine computes for a request, for token-block prefix keys.

Character blocks only approximate the replica's KV blocks, and KV events name blocks by token
ids, so matching them exactly needs the engine's own tokens: the model's chat template rendered
as transformers/vLLM render it (jinja2 sandbox, `trim_blocks`/`lstrip_blocks`, `raise_exception`,
a non-escaping `tojson`, the special tokens as variables), then tokenized without adding special
tokens again. `HFPromptTokenizer` does that from a model folder with the Rust `tokenizers`
library (no transformers in the gateway); `SimPromptTokenizer` does it for simulated replicas.

Conversations grow by a turn at a time, so most of a request was tokenized for the previous
turn. Each request leaves a cache entry for its messages (rendered without the generation
prompt): the tokens before the last special token of that rendering and that token's offset.
A later request whose rendering starts with the entry's text reuses those tokens and tokenizes
only from that special token on. Special tokens split the text before normalization,
pre-tokenization and BPE, so nothing after one can change the tokens before it: the result is
the same as tokenizing from scratch (tests check this on many conversations).

Without local files, `replica_tokenizer.ReplicaTokenizer` asks a replica's own `POST /tokenize` (vLLM and the
stub render the chat template server-side): exact for any model, one round trip per request.

`PromptKeys` runs encoding on one worker thread (or awaits the replica) under a time budget; a
request over budget (or one the tokenizer fails on) falls back to character blocks.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from array import array
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import structlog
import xxhash

from gateway.errors import ConfigError
from gateway.prompt.chat_render import chat_templates, compile_template, engine_message, token_text, vllm_conversation
from gateway.prompt.model_cache import converted_dir
from gateway.prompt.sim_tokens import PIECE_RE, SPECIAL_TOKENS, apply_chat_template, piece_id
from gateway.prompt.tokenized import PREAMBLE_ROLES, TokenizedPrompt, completion_prompt

if TYPE_CHECKING:
    pass

log = structlog.get_logger("gateway.prompt.tokenizers")

MODEL_ALIASES = ("model:smollm2", "model:smollm2-135m-instruct")


@dataclass(frozen=True, slots=True)
class _Entry:
    """Tokens of a rendering up to its last special token, which starts at `resume`."""

    text_len: int
    text_hash: int
    head: array  # type: ignore[type-arg]
    resume: int


class PromptTokenizer(ABC):
    """Chat template + tokenizer of one model, with the incremental cache for growing chats.
    Not thread-safe: call from one thread (PromptKeys' worker)."""

    id_type = "Q"  # array typecode for cached ids

    def __init__(self, max_entries: int = 4096, max_cached_tokens: int = 1 << 23) -> None:
        self.max_entries, self.max_cached_tokens = max_entries, max_cached_tokens
        self.cache_hits = 0
        self.cache_misses = 0
        self._cache: OrderedDict[int, _Entry] = OrderedDict()
        self._cached_tokens = 0

    @abstractmethod
    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[Any] | None,
        add_generation_prompt: bool,
        kwargs: Mapping[str, Any],
    ) -> str:
        """The chat template's text for `messages`."""

    @abstractmethod
    def tokenize(self, text: str) -> tuple[list[int], list[tuple[int, int, int]]]:
        """Ids of `text` (no special tokens added), and (index, start, end) of each special token in it."""

    def conversation(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages as the engine hands them to this template (unchanged unless a template needs it)."""
        return messages

    def warm(self) -> None:
        """Compile the template and load the tokenizer's tables once, outside any request's budget
        (a fresh gateway's first chat took ~40 ms for that alone, then ~0.2 ms), leaving no cache entry."""
        messages = [{"role": "system", "content": "warm-up"}, {"role": "user", "content": "warm-up"}]
        self.tokenize(self.render(messages, tools=None, add_generation_prompt=True, kwargs={}))

    def encode(self, endpoint: str, body: Mapping[str, Any]) -> TokenizedPrompt | None:
        """The engine's prompt ids for a request body; None for a shape this cannot tokenize."""
        if endpoint == "chat":
            return self._encode_chat(body)
        if endpoint != "completions":
            return None
        prompt = completion_prompt(body)
        if isinstance(prompt, str):
            return TokenizedPrompt(tuple(self.tokenize(prompt)[0]), 0)
        return None if prompt is None else TokenizedPrompt(tuple(prompt), 0)

    def _encode_chat(self, body: Mapping[str, Any]) -> TokenizedPrompt | None:
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw or body.get("continue_final_message"):
            return None
        chat = [m for m in map(engine_message, raw) if m is not None]
        if len(chat) != len(raw):
            return None
        chat = self.conversation(chat)
        tools = body.get("tools") or None
        kwargs = body.get("chat_template_kwargs")
        kwargs = kwargs if isinstance(kwargs, dict) else {}
        add_generation_prompt = body.get("add_generation_prompt", True) is not False
        n_pre = next((i for i, m in enumerate(chat) if m["role"] not in PREAMBLE_ROLES), len(chat))
        pre_ids, pre_text = self._encode_messages(chat[:n_pre], tools, kwargs, False) if n_pre else ([], "")
        full_ids, full_text = self._encode_messages(chat, tools, kwargs, add_generation_prompt)
        preamble = len(pre_ids) if full_text.startswith(pre_text) else 0
        return TokenizedPrompt(tuple(full_ids), preamble)

    def _encode_messages(
        self,
        messages: list[dict[str, Any]],
        tools: list[Any] | None,
        kwargs: Mapping[str, Any],
        add_generation_prompt: bool,
    ) -> tuple[list[int], str]:
        """Ids and text of the rendering, reusing the longest cached leading-message prefix."""
        text = self.render(messages, tools=tools, add_generation_prompt=add_generation_prompt, kwargs=kwargs)
        keys = _prefix_keys(messages, tools, kwargs)
        cached = self._from_cache(text, keys)
        if cached is None:
            self.cache_misses += 1
            cached = self.tokenize(text)
        else:
            self.cache_hits += 1
        ids, specials = cached
        base = (
            text
            if not add_generation_prompt
            else self.render(messages, tools=tools, add_generation_prompt=False, kwargs=kwargs)
        )
        if text.startswith(base):
            self._store(keys[-1], base, ids, specials)
        return ids, text

    def _from_cache(self, text: str, keys: list[int]) -> tuple[list[int], list[tuple[int, int, int]]] | None:
        for key in reversed(keys):
            entry = self._cache.get(key)
            if entry is None or entry.text_len > len(text) or _text_hash(text[: entry.text_len]) != entry.text_hash:
                continue
            self._cache.move_to_end(key)
            tail, tail_specials = self.tokenize(text[entry.resume :])
            skip = len(entry.head)
            specials = [(i + skip, s + entry.resume, e + entry.resume) for i, s, e in tail_specials]
            return entry.head.tolist() + tail, specials
        return None

    def _store(self, key: int, text: str, ids: list[int], specials: list[tuple[int, int, int]]) -> None:
        """Remember `text`'s tokens up to its last special token that ends inside it."""
        anchor = next(((i, s) for i, s, e in reversed(specials) if e <= len(text)), None)
        if anchor is None:
            return
        index, start = anchor
        old = self._cache.pop(key, None)
        if old is not None:
            self._cached_tokens -= len(old.head)
        self._cache[key] = _Entry(len(text), _text_hash(text), array(self.id_type, ids[:index]), start)
        self._cached_tokens += index
        while self._cache and (len(self._cache) > self.max_entries or self._cached_tokens > self.max_cached_tokens):
            _, old = self._cache.popitem(last=False)
            self._cached_tokens -= len(old.head)


def _prefix_keys(messages: list[dict[str, Any]], tools: Any, kwargs: Mapping[str, Any]) -> list[int]:
    """Chained hashes: keys[k] names messages[:k+1] under these tools and template kwargs."""
    h = xxhash.xxh3_64_intdigest(orjson.dumps([tools, kwargs], option=orjson.OPT_SORT_KEYS))
    keys = []
    for message in messages:
        h = xxhash.xxh3_64_intdigest(orjson.dumps(message, option=orjson.OPT_SORT_KEYS), h)
        keys.append(h)
    return keys


def _text_hash(text: str) -> int:
    return xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"))


class SimPromptTokenizer(PromptTokenizer):
    """The simulated replicas' ChatML template and hash-id tokenizer, encode-only (remembers no pieces)."""

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[Any] | None,
        add_generation_prompt: bool,
        kwargs: Mapping[str, Any],
    ) -> str:
        return apply_chat_template(messages, add_generation_prompt=add_generation_prompt)

    def tokenize(self, text: str) -> tuple[list[int], list[tuple[int, int, int]]]:
        ids, specials = [], []
        for i, match in enumerate(PIECE_RE.finditer(text)):
            piece = match.group()
            ids.append(piece_id(piece))
            if piece in SPECIAL_TOKENS:
                specials.append((i, match.start(), match.end()))
        return ids, specials


class HFPromptTokenizer(PromptTokenizer):
    """A Hugging Face model folder: tokenizer.json and the chat template, rendered as transformers does."""

    id_type = "I"

    def __init__(self, folder: Path, max_entries: int = 4096, max_cached_tokens: int = 1 << 23) -> None:
        super().__init__(max_entries, max_cached_tokens)
        from tokenizers import Tokenizer

        self.folder = folder
        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self._templates = chat_templates(folder, config)
        self._special_vars = {
            name: token_text(config[name])
            for name in ("bos_token", "eos_token", "unk_token", "pad_token")
            if config.get(name)
        }
        self._special_ids = frozenset(
            i for i, t in self._tok.get_added_tokens_decoder().items() if t.special or not t.normalized
        )
        self._compiled: dict[str, Any] = {}

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[Any] | None,
        add_generation_prompt: bool,
        kwargs: Mapping[str, Any],
    ) -> str:
        name = "tool_use" if tools and "tool_use" in self._templates else "default"
        template = self._compiled.get(name)
        if template is None:
            template = self._compiled[name] = compile_template(self._templates[name])
        variables = {**self._special_vars, **kwargs}
        return str(
            template.render(
                messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **variables
            )
        )

    def conversation(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return vllm_conversation(messages, self._templates["default"])

    def tokenize(self, text: str) -> tuple[list[int], list[tuple[int, int, int]]]:
        encoding = self._tok.encode(text, add_special_tokens=False)
        ids, special = encoding.ids, self._special_ids
        return ids, [
            (i, *span) for i, t in enumerate(ids) if t in special and (span := encoding.token_to_chars(i)) is not None
        ]


def _from_gguf(path: Path, key: str) -> Path:
    """The tokenizer and chat template inside a GGUF, written once as a tokenizer folder in the
    user's cache (keyed by the file's path, size and mtime). Needs transformers + gguf (`[model]`)."""
    stat = path.stat()
    name = f"{path.stem}-{xxhash.xxh3_64_hexdigest(f'{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}'.encode())}"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "affinity-gateway" / "tokenizers"
    folder = cache / name
    if (folder / "tokenizer.json").is_file():
        return folder
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError(
            f"{str(path)!r}: reading a tokenizer from a GGUF needs transformers and gguf "
            "(pip install 'affinity-gateway[model]'), or point to a tokenizer.json",
            key=key,
        ) from None
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gguf-", dir=cache))
    try:
        AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another process wrote it first
            if not (folder / "tokenizer.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def build_prompt_tokenizer(spec: str, key: str = "") -> PromptTokenizer:
    """ "sim", a model folder (or its tokenizer.json), a GGUF file, or an alias such as "model:smollm2"."""
    if spec == "sim":
        return SimPromptTokenizer()
    if spec.lower() in MODEL_ALIASES:
        folder = converted_dir()
        if not (folder / "tokenizer.json").is_file():
            raise ConfigError(
                f"{spec!r}: the real model is not converted at {folder} (run `make model` and "
                "start a real replica once)",
                key=key,
            )
    else:
        path = Path(spec).expanduser()
        if not path.exists():
            raise ConfigError(f"{spec!r}: no such file or folder", key=key)
        folder = _from_gguf(path, key) if path.suffix == ".gguf" else path.parent if path.is_file() else path
        if not (folder / "tokenizer.json").is_file():
            raise ConfigError(f"{spec!r}: no tokenizer.json in {folder}", key=key)
    try:
        return HFPromptTokenizer(folder)
    except ConfigError as exc:
        raise ConfigError(f"{spec!r}: {exc.reason}", key=key) from None
