"""PromptKeys: a prompt tokenized within its budget or not at all, background encodes that never hold a
request up, and a client's cancel that is never lost."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.prompt.prompt_keys import PromptKeys
from gateway.prompt.tokenized import TokenizedPrompt
from gateway.prompt.tokenizers import SimPromptTokenizer

pytestmark = pytest.mark.timeout(60)


class Slow(SimPromptTokenizer):
    def encode(self, endpoint: str, body: Any) -> TokenizedPrompt | None:
        time.sleep(0.3)
        return super().encode(endpoint, body)


class Broken(SimPromptTokenizer):
    def render(self, *args: Any, **kwargs: Any) -> str:
        raise ValueError("template failed")


async def test_prompt_keys_budget_and_errors() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    keys = PromptKeys(SimPromptTokenizer())
    assert await keys.encode("chat", body) == SimPromptTokenizer().encode("chat", body)
    await keys.close()
    slow = PromptKeys(Slow(), budget_s=0.02)
    assert await slow.encode("chat", body) is None
    assert (slow.over_budget, slow.errors) == (1, 0)
    await slow.close()
    broken = PromptKeys(Broken())
    assert await broken.encode("chat", body) is None
    assert (broken.errors, broken.over_budget) == (1, 0)
    assert await broken.encode("completions", {"prompt": "fine"}) is not None
    await broken.close()


class Steady(SimPromptTokenizer):
    def encode(self, endpoint: str, body: Any) -> TokenizedPrompt | None:
        time.sleep(0.1)
        return super().encode(endpoint, body)


async def test_background_encodes_never_queue_more_than_one_job_ahead_of_a_request() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    keys = PromptKeys(Steady(), budget_s=0.45, max_later=6)  # one job ahead: 0.2 s; all six: 0.7 s
    later = [asyncio.create_task(keys.encode_later("chat", body)) for _ in range(6)]
    await asyncio.sleep(0.01)  # the first background job is in the worker now
    assert await keys.encode_later("chat", body) is None and keys.dropped_later == 1  # six already waiting
    assert await keys.encode("chat", body) is not None  # waited for that one job only, not six
    assert all(r is not None for r in await asyncio.gather(*later))
    await keys.close()


async def test_a_client_gone_as_its_prompt_is_encoded_is_not_routed() -> None:
    """The handler's cancel (the client disconnected) lands in the loop turn where the encode
    completes: Python 3.11's wait_for returned the result and dropped the cancel (bpo-42130), so
    the request went on to a replica for a client that was gone."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    class Remote:  # the replica's /tokenize: any awaitable
        def encode(self, endpoint: str, body: dict[str, Any]) -> asyncio.Future[None]:
            return done

    keys = PromptKeys(Remote(), budget_s=5.0)  # type: ignore[arg-type]
    request = asyncio.create_task(keys.encode("chat", {}))
    await asyncio.sleep(0.01)
    done.set_result(None)
    request.cancel()
    await asyncio.gather(request, return_exceptions=True)
    assert request.cancelled()
