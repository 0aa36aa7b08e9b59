"""A deterministic, prefix-stable tokenizer for the simulator: the pieces, ids and ChatML template of
`gateway.prompt.sim_tokens` (shared with the gateway's prompt keys), plus decoding, so decode(encode(x)) == x."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gateway.prompt.sim_tokens import IM_END, PIECE_RE, SPECIAL_TOKENS, apply_chat_template, piece_id


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
        return [self._remember(m.group()) for m in PIECE_RE.finditer(text)]

    def pieces(self, text: str) -> list[str]:
        return PIECE_RE.findall(text)

    def decode(self, token_ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """Raises KeyError for an id this process never produced."""
        skip = self.special_ids if skip_special_tokens else frozenset()
        return "".join(self._pieces[t] for t in token_ids if t not in skip)

    def is_known(self, token_id: int) -> bool:
        return token_id in self._pieces

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        return apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
