"""The replicas' own `POST /tokenize` as a prompt tokenizer: exact for any model, one round trip per request.

vLLM and the stub render the chat template server-side, so the ids are the engine's whatever the
model; `gateway.prompt.tokenizers.PromptKeys` awaits it under the same time budget as a local tokenizer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import orjson
import xxhash

from gateway.prompt.tokenized import PREAMBLE_ROLES, TokenizedPrompt, completion_prompt
from gateway.support.bounded import put_newest


class ReplicaTokenizer:
    """The replicas' own `POST /tokenize`: the server renders its chat template and tokenizes, so
    the ids are the engine's whatever the model. The preamble's length costs one more call per
    distinct preamble (cached). `urls` gives the pool's replicas that take traffic now."""

    def __init__(
        self, model: str, urls: Callable[[], Sequence[str]], timeout_s: float = 5.0, max_preambles: int = 4096
    ) -> None:
        self.model, self.urls, self.timeout_s, self.max_preambles = model, urls, timeout_s, max_preambles
        self.requests = 0  # /tokenize calls made
        self._preambles: dict[int, int] = {}
        self._turn = itertools.count()
        self._session: aiohttp.ClientSession | None = None

    async def encode(self, endpoint: str, body: Mapping[str, Any]) -> TokenizedPrompt | None:
        urls = self.urls()
        if not urls or endpoint not in ("chat", "completions"):
            return None
        url = urls[next(self._turn) % len(urls)]
        if endpoint == "completions":
            prompt = completion_prompt(body)
            if isinstance(prompt, str):
                return TokenizedPrompt(tuple(await self._tokenize(url, {"prompt": prompt})), 0)
            return None if prompt is None else TokenizedPrompt(tuple(prompt), 0)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or body.get("continue_final_message"):
            return None
        extra = {k: body[k] for k in ("tools", "chat_template_kwargs") if body.get(k)}
        ids = await self._tokenize(
            url,
            {
                "messages": messages,
                **extra,
                "add_generation_prompt": body.get("add_generation_prompt", True) is not False,
            },
        )
        return TokenizedPrompt(tuple(ids), await self._preamble(url, messages, extra))

    async def _preamble(self, url: str, messages: list[Any], extra: dict[str, Any]) -> int:
        n = next(
            (i for i, m in enumerate(messages) if not isinstance(m, dict) or m.get("role") not in PREAMBLE_ROLES),
            len(messages),
        )
        if n == 0:
            return 0
        key = xxhash.xxh3_64_intdigest(orjson.dumps([messages[:n], extra], option=orjson.OPT_SORT_KEYS))
        tokens = self._preambles.get(key)
        if tokens is None:
            tokens = len(await self._tokenize(url, {"messages": messages[:n], **extra, "add_generation_prompt": False}))
            put_newest(self._preambles, key, tokens, self.max_preambles)
        return tokens

    async def _tokenize(self, url: str, payload: dict[str, Any]) -> list[int]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        self.requests += 1
        async with self._session.post(
            f"{url}/tokenize",
            data=orjson.dumps({"model": self.model, **payload}),
            headers={"Content-Type": "application/json"},
        ) as response:
            data = orjson.loads(await response.read())
        tokens = data.get("tokens") if response.status == 200 and isinstance(data, dict) else None
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            raise ValueError(f"{url}/tokenize answered {response.status} without a token list")
        return tokens

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
