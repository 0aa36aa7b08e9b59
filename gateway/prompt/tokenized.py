"""What a tokenizer gives the prefix keys, shared by the local tokenizers (`gateway.prompt.tokenizers`) and a
replica's own `/tokenize` (`gateway.prompt.replica_tokenizer`): the prompt's ids, and which prompt a
completions request carries."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PREAMBLE_ROLES = frozenset(("system", "developer"))


@dataclass(frozen=True, slots=True)
class TokenizedPrompt:
    """The ids the engine computes for a request's prompt."""

    token_ids: tuple[int, ...]
    preamble_tokens: int  # tokens of the tools + leading system/developer messages rendered alone (0: none)


def completion_prompt(body: Mapping[str, Any]) -> str | list[int] | None:
    """A completions request's prompt: text, token ids as given, or None for another shape."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch: route by the first, as prefix.prompt_source does
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return prompt
    return None


__all__ = ["PREAMBLE_ROLES", "TokenizedPrompt", "completion_prompt"]
