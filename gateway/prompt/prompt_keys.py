"""Token-exact prompts on the request path within a time budget: a local tokenizer on one worker
thread (`tokenizers`) or a replica's /tokenize (`replica_tokenizer`); a request whose prompt is not
tokenized in time is keyed by its characters instead."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import structlog

from gateway.prompt.tokenized import TokenizedPrompt
from gateway.prompt.tokenizers import PromptTokenizer

if TYPE_CHECKING:
    from gateway.prompt.replica_tokenizer import ReplicaTokenizer

log = structlog.get_logger("gateway.prompt.prompt_keys")


class PromptKeys:
    """Encodes within `budget_s` (a local tokenizer on one worker thread, or a replica's /tokenize);
    None (and a count) when over budget or failing.

    `encode_later` is for work off the request path (an answer recorded for the next turn): it
    waits until no request is being encoded and keeps at most one job in the worker's queue, so a
    request never waits behind more than one of them; past `max_later` waiting jobs, new ones are
    dropped (counted)."""

    def __init__(
        self, tokenizer: PromptTokenizer | ReplicaTokenizer, budget_s: float = 0.05, max_later: int = 1000
    ) -> None:
        self.tokenizer, self.budget_s, self.max_later = tokenizer, budget_s, max_later
        self.over_budget = 0
        self.errors = 0
        self.dropped_later = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prompt-tokenizer")
        self._urgent = 0  # request-path encodes in flight
        self._idle = asyncio.Event()  # set while _urgent == 0
        self._idle.set()
        self._later = asyncio.Lock()  # one background job at a time
        self._later_waiting = 0
        if isinstance(tokenizer, PromptTokenizer):
            self._executor.submit(tokenizer.warm)  # first in the worker's queue: before any request

    async def encode(self, endpoint: str, body: Mapping[str, Any]) -> TokenizedPrompt | None:
        self._urgent += 1
        self._idle.clear()
        try:
            return await self._encode(endpoint, body, self.budget_s)
        finally:
            self._urgent -= 1
            if not self._urgent:
                self._idle.set()

    async def encode_later(
        self,
        endpoint: str,
        body: Mapping[str, Any],
        timeout_s: float = 5.0,
    ) -> TokenizedPrompt | None:
        if self._later_waiting >= self.max_later:
            self.dropped_later += 1
            return None
        self._later_waiting += 1
        try:
            async with self._later:
                await self._idle.wait()
                return await self._encode(endpoint, body, timeout_s)
        finally:
            self._later_waiting -= 1

    async def _encode(self, endpoint: str, body: Mapping[str, Any], timeout_s: float) -> TokenizedPrompt | None:
        if not isinstance(self.tokenizer, PromptTokenizer):
            work: Any = self.tokenizer.encode(endpoint, body)
        else:
            work = asyncio.get_running_loop().run_in_executor(self._executor, self.tokenizer.encode, endpoint, body)
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: on 3.11 it can drop the client's cancel (bpo-42130)
                prompt: TokenizedPrompt | None = await work
                return prompt
        except TimeoutError:
            self.over_budget += 1
            return None
        except Exception as exc:  # a template error or odd input must not fail the request
            self.errors += 1
            log.warning("prompt_tokenize_failed", endpoint=endpoint, error=type(exc).__name__)
            return None

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        if not isinstance(self.tokenizer, PromptTokenizer):
            await self.tokenizer.close()
