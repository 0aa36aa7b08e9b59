"""The Engine protocol: what the loop needs from anything that runs a model step.

The loop calls `execute(step)` once per scheduler step and gets back one sampled token id
per request whose `ScheduledRequest.samples` is true. Everything about *which* tokens to
compute, which KV blocks they live in (`ScheduledRequest.block_ids`, indices into the
engine's own per-block KV storage) and when requests end is decided by the scheduler; the
engine only computes. A real model engine runs the forward pass in a worker thread
(`await asyncio.to_thread(...)`) so the event loop keeps serving streams meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from replica_stub.scheduler import SchedulerOutput


class Tokenizer(Protocol):
    """The engine's tokenizer as the server uses it (a HF tokenizer fits behind a thin adapter)."""

    eos_token_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Iterable[int], *, skip_special_tokens: bool = True) -> str: ...

    def is_known(self, token_id: int) -> bool: ...

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True
    ) -> str: ...


class Engine(Protocol):
    name: str
    tokenizer: Tokenizer

    async def execute(self, step: SchedulerOutput) -> dict[str, int]:
        """Run one step; return {request_id: sampled token id} for the sampling requests.
        Requests in `step.finished_request_ids` are gone: drop any per-request state."""
        ...

    async def close(self) -> None: ...
