"""Request → canonical prefix text → fixed-size blocks → xxh3 chain hashes (pure, no I/O).

A block's hash is seeded with its parent's hash, so one hash names the whole prefix up to that
block: two requests share the first k hashes exactly when they share the first k full blocks.
The first block is seeded with the model name (and the LoRA adapter the request names, and,
with `salt_by_tenant`, the tenant), so prompts never match across models, adapters or tenants.
Only full blocks are hashed: a replica caches only full KV blocks, and a partial tail would
change on the next turn anyway.

Chat requests render in a prefix-stable order: tool definitions first, then each message as a
role marker plus its content, tool calls and name, in order. Turn n+1 of a conversation repeats
turn n's messages and answer, so its rendering starts with turn n's and shares its hashes.
The preamble (tools and leading system messages) is measured too: a policy may treat it as
shared by every conversation rather than as a reason to pin one.
Character blocks approximate token blocks (`block_chars` ≈ `chars_per_token` × the replica's
KV block size); token ids sent by the client (completions), or produced by the pool's tokenizer
(`gateway.prompt.tokenizers`: the model's chat template and tokenizer, exactly as the replica runs them),
are hashed in blocks of `block_tokens`, the replica's KV block size: those keys name the
replica's own KV blocks, and KV events (`gateway.index.exact`) key stored blocks the same way.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import orjson
import xxhash

from gateway.config.pools import PrefixConfig
from gateway.errors import BadRequestError
from gateway.prompt.api_shapes import CHAT_SHAPED
from gateway.support.records import record
from gateway.view import RequestView

if TYPE_CHECKING:
    from gateway.prompt.tokenized import TokenizedPrompt

_hash = xxhash.xxh3_64_intdigest
_ROLE = "\x1e"  # record separator: cannot be confused with JSON or ordinary prompt text
_FIELD = "\x1f"
TOKENS, CHARACTERS = "tokens", "characters"


@record
class Prefix:
    block_hashes: tuple[int, ...]
    prompt_tokens: int  # estimate, or exact when the client sent token ids
    tokens_per_block: float
    preamble_tokens: int  # blocks wholly inside the tools + leading system messages, in tokens
    preamble_key: int = 0  # hash of the last of those blocks (0: none); names the preamble
    kind: str = CHARACTERS  # or "tokens": keys comparable with the replica's KV blocks (events)


def compute(view: RequestView, params: PrefixConfig) -> Prefix:
    """Hash `view`'s prompt. Unknown shapes give no blocks (the request still routes, by load)."""
    seed = _seed(view, params)
    source, preamble = prompt_source(view.endpoint, view.body)
    if isinstance(source, str):
        blocks = chain_hash_text(source, params.block_chars, seed, params.max_blocks)
        per_block = params.tokens_per_block
        inside = min(preamble // params.block_chars, len(blocks))
        return Prefix(
            blocks,
            math.ceil(len(source) / params.chars_per_token),
            per_block,
            int(inside * per_block),
            blocks[inside - 1] if inside else 0,
        )
    blocks = chain_hash_tokens(source, params.block, seed, params.max_blocks)
    return Prefix(blocks, len(source), float(params.block), 0, kind=TOKENS)


def attach(view: RequestView, keyed: Prefix) -> None:
    """Keep the keys on the view: a retry of the request reuses them."""
    view.block_hashes, view.preamble_tokens = keyed.block_hashes, keyed.preamble_tokens
    view.preamble_key, view.tokens_per_block, view.key_kind = keyed.preamble_key, keyed.tokens_per_block, keyed.kind
    view.prompt_tokens_estimate = view.prompt_tokens_estimate or keyed.prompt_tokens


def from_tokens(view: RequestView, params: PrefixConfig, prompt: TokenizedPrompt) -> Prefix:
    """Hash a token-exact prompt in the replica's KV blocks (`block_tokens`)."""
    blocks = chain_hash_tokens(prompt.token_ids, params.block, _seed(view, params), params.max_blocks)
    inside = min(prompt.preamble_tokens // params.block, len(blocks))
    return Prefix(
        blocks,
        len(prompt.token_ids),
        float(params.block),
        inside * params.block,
        blocks[inside - 1] if inside else 0,
        kind=TOKENS,
    )


def model_seed(model: str) -> int:
    """The first block's seed without any salt: what a KV event's chain starts from."""
    return _hash(model.encode())


def adapter_seed(seed: int, adapter: str) -> int:
    """The first block's seed for a LoRA adapter's request (or KV event), from its base model's seed."""
    return _hash(adapter.encode(), seed)


def is_salted(view: RequestView, params: PrefixConfig) -> bool:
    """Whether `view`'s chain is seeded with more than the model (tenant or cache_salt): its keys
    can never equal keys derived from KV events, which do not carry the salt."""
    return (params.salt_by_tenant and bool(view.tenant)) or isinstance(view.body.get("cache_salt"), str)


def body_with_answer(view: RequestView, answer: str) -> dict[str, Any] | None:
    """`view`'s request as the conversation's next turn will repeat it: the prompt followed by
    its answer (None when that cannot be written down, e.g. a prompt of token ids)."""
    endpoint, body = view.endpoint, view.body
    if endpoint in ("chat", "messages"):  # the answer as its own assistant turn, as the client sends it back
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        turns = [*messages, {"role": "assistant", "content": answer}]
        if endpoint == "messages":
            return {**body, "messages": turns}
        return {**body, "messages": turns, "add_generation_prompt": False}
    if endpoint == "responses":  # the answer as the output message a client passes back in `input`
        given = body.get("input")
        items = [{"role": "user", "content": given}] if isinstance(given, str) else given
        if not isinstance(items, list):
            return None
        said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]}
        return {**body, "input": [*items, said]}
    prompt, _ = prompt_source(endpoint, body)
    return {**body, "prompt": prompt + answer} if isinstance(prompt, str) else None


def with_answer(view: RequestView, params: PrefixConfig, answer: str) -> tuple[int, ...]:
    """The character chain of `view`'s prompt followed by its answer. Only the blocks past
    `view.block_hashes` are hashed (the chain continues from its last)."""
    prompt = view.body.get("prompt") if view.endpoint == "completions" else None
    if isinstance(prompt, str):  # what body_with_answer and prompt_source would make of it, without the copy
        text = prompt + answer
    else:
        body = body_with_answer(view, answer)
        if body is None:
            return view.block_hashes
        source, _ = prompt_source(view.endpoint, body)
        assert isinstance(source, str)
        text = source
    done = len(view.block_hashes)
    seed = view.block_hashes[-1] if done else _seed(view, params)
    rest = chain_hash_text(text[done * params.block_chars :], params.block_chars, seed, params.max_blocks - done)
    return view.block_hashes + rest


def _seed(view: RequestView, params: PrefixConfig) -> int:
    cache_salt = view.body.get("cache_salt")  # vLLM's own per-request cache isolation
    return _seed_of(
        view.model,
        view.tenant if params.salt_by_tenant else None,
        cache_salt if isinstance(cache_salt, str) else None,
        view.adapter,
    )


@lru_cache(maxsize=1024)
def _seed_of(model: str, tenant: str | None, cache_salt: str | None, adapter: str | None) -> int:
    """The first block's seed; a few models, tenants and adapters make nearly every request's, so it is
    computed once for each."""
    parts = [model]
    if tenant:
        parts.append(tenant)
    if cache_salt is not None:
        parts.append(cache_salt)
    seed = _hash("\x00".join(parts).encode())
    return seed if adapter is None else adapter_seed(seed, adapter)


def prompt_source(endpoint: str, body: dict[str, Any]) -> tuple[str | list[int], int]:
    """The text (or token ids) whose prefix the replica caches ("" when there is none), and
    the length of its shared preamble (conversations only; 0 otherwise)."""
    if endpoint == "chat":
        return render_chat(body)
    if endpoint in CHAT_SHAPED:  # Anthropic messages, the Responses API
        return render_chat(CHAT_SHAPED[endpoint](body))
    if endpoint == "audio":
        return "", 0  # an upload: its text `prompt` guides the decoder, it is no cached prefix
    prompt = body.get("input" if endpoint == "embeddings" else "prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of prompts: route by the first
    if isinstance(prompt, str):
        return prompt, 0
    if isinstance(prompt, list) and prompt and type(prompt[0]) is int:
        return prompt, 0  # token ids; the rest are checked when packed
    return "", 0


def render_chat(body: dict[str, Any]) -> tuple[str, int]:
    """Tools, then messages, each as role marker + content: turn n's text prefixes turn n+1's.

    Also returns the length of the preamble: tools and leading system/developer messages, the
    part many conversations share (it is cached everywhere soon, so it should not pin traffic).
    """
    out: list[str] = []
    tools = body.get("tools")
    if tools:
        out.append(f"{_ROLE}tools{_FIELD}{_canonical(tools)}")
    messages = body.get("messages")
    if not isinstance(messages, list):
        text = "".join(out)
        return text, len(text)
    preamble = -1
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role", "")
        if preamble < 0 and role not in ("system", "developer"):
            preamble = sum(map(len, out))
        out.append(f"{_ROLE}{role}{_FIELD}")
        name = message.get("name")
        if name:
            out.append(f"name={name}{_FIELD}")
        out.append(_content(message.get("content")))
        if message.get("tool_calls"):
            out.append(f"{_FIELD}{_canonical(message['tool_calls'])}")
        if message.get("tool_call_id"):
            out.append(f"{_FIELD}{message['tool_call_id']}")
    text = "".join(out)
    return text, len(text) if preamble < 0 else preamble


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Text parts joined; other parts (images, audio) by canonical JSON so they still key the cache.
        return "".join(
            part["text"]
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            else _canonical(part)
            for part in content
        )
    return "" if content is None else _canonical(content)


def _canonical(value: Any) -> str:
    """orjson writes less depth than it reads (254 levels against 1024): a body it parsed may not render."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONEncodeError as exc:
        raise BadRequestError(f"request nested too deeply to route: {exc}") from None


def chain_hash_text(text: str, block_chars: int, seed: int, max_blocks: int) -> tuple[int, ...]:
    """xxh3_64 of each full `block_chars` block, seeded with the previous block's hash."""
    n = min(len(text) // block_chars, max_blocks)
    data = text[: n * block_chars].encode()
    ascii_bytes = data if len(data) == n * block_chars else None  # ASCII (common): characters are bytes
    hashes: list[int] = []
    add = hashes.append
    h = seed
    for start in range(0, n * block_chars, block_chars):
        end = start + block_chars
        h = _hash(ascii_bytes[start:end] if ascii_bytes is not None else text[start:end].encode(), h)
        add(h)
    return tuple(hashes)


def chain_hash_tokens(tokens: Sequence[int], block_tokens: int, seed: int, max_blocks: int) -> tuple[int, ...]:
    """The same chain over token ids packed as uint64 (the simulator's ids are 48-bit). The
    gateway keys a request's tokens and a KV event's tokens with this one function."""
    n = min(len(tokens) // block_tokens, max_blocks)
    if n == 0:
        return ()
    try:
        data = array("Q", tokens[: n * block_tokens]).tobytes()
    except (OverflowError, TypeError):  # not a list of token ids
        return ()
    step = 8 * block_tokens
    hashes = []
    h = seed
    view = memoryview(data)
    for start in range(0, n * step, step):
        h = _hash(view[start : start + step], h)
        hashes.append(h)
    return tuple(hashes)
