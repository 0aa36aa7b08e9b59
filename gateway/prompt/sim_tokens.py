"""The simulated model's tokens and chat template: what the gateway's `SimPromptTokenizer` and the
replica stub's `SimTokenizer` must agree on, id for id.

Pieces are: the two special tokens, runs of up to 8 non-space characters (a word's last run
carries the whitespace that follows it), and leading whitespace. Ids are a hash of the piece,
so every process agrees on them without a vocabulary file. The product owns them and the stub
(its test double) imports them, never the reverse.

Prefix stability is what makes the cache work across turns: encode(a + b) starts with
encode(a) whenever `a` ends at a piece boundary (after whitespace, before a non-space). The
simulator generates whole short words each followed by a space, so an answer rendered back
into the next turn's prompt tokenizes to exactly the ids the engine generated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import xxhash

from gateway.prompt.chat_render import render_content

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (IM_START, IM_END)
MAX_RUN_CHARS = 8
_ID_BITS = 48  # exact in JavaScript numbers; collisions are negligible at this width

PIECE_RE = re.compile(
    r"<\|im_start\|>|<\|im_end\|>"
    rf"|(?:(?!<\|im_(?:start|end)\|>)\S){{1,{MAX_RUN_CHARS}}}\s*"
    r"|\s+",
)


def piece_id(piece: str) -> int:
    return xxhash.xxh3_64_intdigest(piece.encode()) & ((1 << _ID_BITS) - 1)


def apply_chat_template(messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
    """ChatML: `<|im_start|>role\\ncontent<|im_end|>\\n` per message, then `<|im_start|>assistant\\n`."""
    parts = [f"{IM_START}{m['role']}\n{render_content(m.get('content'))}{IM_END}\n" for m in messages]
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)
