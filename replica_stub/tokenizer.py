"""A deterministic, prefix-stable tokenizer and a ChatML chat template for the simulator.

Pieces are: the two special tokens, runs of up to 8 non-space characters (a word's last run
carries the whitespace that follows it), and leading whitespace. Ids are a hash of the piece,
so every process agrees on them without a vocabulary file, and decode(encode(x)) == x.

Prefix stability is what makes the cache work across turns: encode(a + b) starts with
encode(a) whenever `a` ends at a piece boundary (after whitespace, before a non-space). The
simulator generates whole short words each followed by a space, so an answer rendered back
into the next turn's prompt tokenizes to exactly the ids the engine generated.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import xxhash

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (IM_START, IM_END)
MAX_RUN_CHARS = 8
_ID_BITS = 48  # exact in JavaScript numbers; collisions are negligible at this width

_PIECE_RE = re.compile(
    r"<\|im_start\|>|<\|im_end\|>"
    rf"|(?:(?!<\|im_(?:start|end)\|>)\S){{1,{MAX_RUN_CHARS}}}\s*"
    r"|\s+",
)


def piece_id(piece: str) -> int:
    return xxhash.xxh3_64_intdigest(piece.encode()) & ((1 << _ID_BITS) - 1)


class SimTokenizer:
    """encode/decode with hash ids; remembers every piece it has seen so decode can invert."""

    def __init__(self, extra_pieces: Iterable[str] = ()) -> None:
        self._pieces: dict[int, str] = {}
        for piece in (*SPECIAL_TOKENS, *extra_pieces):
            self._remember(piece)
        self.eos_token_id = piece_id(IM_END)
        self.special_ids = frozenset(piece_id(p) for p in SPECIAL_TOKENS)

    def _remember(self, piece: str) -> int:
        token_id = piece_id(piece)
        self._pieces.setdefault(token_id, piece)
        return token_id

    def encode(self, text: str) -> list[int]:
        return [self._remember(m.group()) for m in _PIECE_RE.finditer(text)]

    def pieces(self, text: str) -> list[str]:
        return _PIECE_RE.findall(text)

    def decode(self, token_ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """Raises KeyError for an id this process never produced."""
        skip = self.special_ids if skip_special_tokens else frozenset()
        return "".join(self._pieces[t] for t in token_ids if t not in skip)

    def is_known(self, token_id: int) -> bool:
        return token_id in self._pieces

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        return apply_chat_template(messages, add_generation_prompt=add_generation_prompt)


def render_content(content: Any) -> str:
    """A message's content: a string, None, or a list of OpenAI content parts, whose text parts are
    joined with "\n" as vLLM joins them (other parts carry no text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content
                     if isinstance(part, Mapping) and part.get("type", "text") == "text")


def apply_chat_template(messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
    """ChatML: `<|im_start|>role\\ncontent<|im_end|>\\n` per message, then `<|im_start|>assistant\\n`."""
    parts = [f"{IM_START}{m['role']}\n{render_content(m.get('content'))}{IM_END}\n" for m in messages]
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)
