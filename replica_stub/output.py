"""Per-request output side: incremental detokenization, stop strings, the stream of deltas.

Stop strings are matched on text (as vLLM's detokenizer does): the matched string and
anything after it is dropped and the request finishes with reason "stop". While a request
runs, the last `len(longest stop) - 1` characters are held back so a stop string split
across tokens never leaks to the client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from replica_stub.engine.base import Tokenizer
from replica_stub.request import Request

MAX_CHAR_TOKENS = 4  # UTF-8 characters are at most 4 bytes, so at most 4 byte-level tokens


@dataclass(frozen=True, slots=True)
class Delta:
    text: str
    num_new_tokens: int
    finish_reason: str | None = None
    stop_reason: str | None = None


class RequestStream:
    """What a handler awaits: deltas pushed by the engine loop, ending with a finish reason.

    Deltas collect in a list and one future wakes the handler, which takes everything pending
    at once: a handler that falls behind catches up with one write instead of one per token.
    """

    def __init__(self, request: Request, tokenizer: Tokenizer, stop: tuple[str, ...]) -> None:
        self.request = request
        self._tokenizer = tokenizer
        self._stop = stop
        self._holdback = max((len(s) for s in stop), default=1) - 1
        self._text = ""
        self._undecoded: list[int] = []
        self._sent = 0
        self._pending: list[Delta] = []
        self._waiter: asyncio.Future[None] | None = None
        self.first_token_time: float | None = None
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None
        self.num_output_tokens = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add_tokens(self, token_ids: list[int], finish_reason: str | None) -> bool:
        """Queue the delta for new tokens. True if a stop string ended the request here."""
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        self.num_output_tokens += len(token_ids)
        start = max(0, len(self._text) - self._holdback)
        self._text += self._decode(token_ids, final=finish_reason is not None)
        stop_reason = None
        for stop in self._stop:
            index = self._text.find(stop, start)
            if index >= 0:
                self._text, stop_reason, finish_reason = self._text[:index], stop, "stop"
                break
        end = len(self._text) if finish_reason else max(self._sent, len(self._text) - self._holdback)
        delta, self._sent = self._text[self._sent : end], end
        self.finish_reason, self.stop_reason = finish_reason, stop_reason
        self._pending.append(Delta(delta, len(token_ids), finish_reason, stop_reason))
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        return stop_reason is not None

    def _decode(self, token_ids: list[int], *, final: bool) -> str:
        """Text of the new tokens. A byte-level BPE splits a multi-byte character (emoji, CJK)
        over up to 4 tokens, each of which alone decodes to U+FFFD: such tokens wait for the
        rest of their character and are decoded together."""
        self._undecoded.extend(token_ids)
        text = self._tokenizer.decode(self._undecoded)
        if text.endswith("\ufffd") and not final and len(self._undecoded) < MAX_CHAR_TOKENS:
            return ""
        self._undecoded = []
        return text

    def take(self) -> list[Delta]:
        """Everything pushed since the last take."""
        pending, self._pending = self._pending, []
        return pending

    async def batches(self) -> AsyncIterator[list[Delta]]:
        """Pending deltas in batches, until the one carrying the finish reason."""
        while True:
            if not self._pending:
                self._waiter = asyncio.get_running_loop().create_future()
                await self._waiter
            batch = self.take()
            yield batch
            if batch[-1].finish_reason is not None:
                return
