"""vLLM's pooling routes on the stub: `/v1/embeddings`, `/pooling`, `/classify`, `/v1/score`, `/v1/rerank`.

A pooling model's numbers are made up here, but deterministically and in vLLM's exact shapes
(ids, `object`, `usage`): vectors and class probabilities come from a hash of the input's tokens,
scores from the token overlap of the two texts (identical texts score 1). Inputs are counted in
the engine's tokens, so `usage` matches `/tokenize`.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import xxhash
from aiohttp import web

from gateway.errors import BadRequestError
from replica_stub.generation import CONFIG, ENGINE
from replica_stub.protocol import check_model

ReadBody = Callable[[web.Request], Awaitable[dict[str, Any]]]
_DIM = 8  # the sim model's hidden size
LABELS = ("negative", "positive")


def add_routes(app: web.Application, read_body: ReadBody) -> None:
    """`read_body` is the server's JSON-body reader (415 for other content types, 400 for bad JSON)."""

    async def handle(
        request: web.Request, answer: Callable[[web.Request, dict[str, Any]], dict[str, Any]]
    ) -> web.Response:
        body = await read_body(request)
        check_model(body, request.app[CONFIG].model)
        return web.Response(body=orjson.dumps(answer(request, body)), content_type="application/json")

    for path, answer in (
        ("/v1/embeddings", _embeddings),
        ("/pooling", _pooling),
        ("/classify", _classify),
        ("/score", _score),
        ("/v1/score", _score),
        ("/rerank", _rerank),
        ("/v1/rerank", _rerank),
        ("/v2/rerank", _rerank),
    ):
        app.router.add_post(path, functools.partial(handle, answer=answer))


def _inputs(body: dict[str, Any], name: str = "input") -> list[str | list[int]]:
    value = body.get(name)
    if isinstance(value, str) and value:
        return [value]
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return list(value)
    raise BadRequestError(f"`{name}` must be a non-empty string, a list of strings or a list of token ids", param=name)


def _tokens(request: web.Request, text: str | list[int]) -> list[int]:
    return list(text) if isinstance(text, list) else request.app[ENGINE].tokenizer.encode(text)


def _vector(tokens: list[int]) -> list[float]:
    seed = xxhash.xxh3_64_intdigest(orjson.dumps(tokens))
    return [round(((seed >> (8 * i)) & 0xFF) / 127.5 - 1.0, 6) for i in range(_DIM)]


def _similarity(a: list[int], b: list[int]) -> float:
    sa, sb = set(a), set(b)
    return round(len(sa & sb) / len(sa | sb), 6) if sa or sb else 0.0


def _usage(prompt_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }


def _listing(request: web.Request, prefix: str, data: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": request.app[CONFIG].model,
        "data": data,
        "usage": _usage(tokens),
    }


def _embeddings(request: web.Request, body: dict[str, Any]) -> dict[str, Any]:
    encoded = [_tokens(request, text) for text in _inputs(body)]
    data = [{"index": i, "object": "embedding", "embedding": _vector(t)} for i, t in enumerate(encoded)]
    answer = _listing(request, "embd", data, sum(map(len, encoded)))
    prompt_tokens = answer["usage"]["prompt_tokens"]
    answer["usage"] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return answer


def _pooling(request: web.Request, body: dict[str, Any]) -> dict[str, Any]:
    encoded = [_tokens(request, text) for text in _inputs(body)]
    data = [{"index": i, "object": "pooling", "data": _vector(t)} for i, t in enumerate(encoded)]
    return _listing(request, "pool", data, sum(map(len, encoded)))


def _classify(request: web.Request, body: dict[str, Any]) -> dict[str, Any]:
    encoded = [_tokens(request, text) for text in _inputs(body)]
    data = []
    for i, tokens in enumerate(encoded):
        positive = round((_vector(tokens)[0] + 1) / 2, 6)
        probs = [round(1 - positive, 6), positive]
        data.append({"index": i, "label": LABELS[probs.index(max(probs))], "probs": probs, "num_classes": 2})
    return _listing(request, "classify", data, sum(map(len, encoded)))


def _pairs(request: web.Request, body: dict[str, Any]) -> tuple[list[tuple[list[int], list[int]]], int]:
    """vLLM's score pairing: one text against many, or two lists pairwise."""
    first = [_tokens(request, t) for t in _inputs(body, "text_1")]
    second = [_tokens(request, t) for t in _inputs(body, "text_2")]
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise BadRequestError("text_1 and text_2 must have the same length, or text_1 one text", param="text_1")
    return list(zip(first, second)), sum(map(len, first)) + sum(map(len, second))


def _score(request: web.Request, body: dict[str, Any]) -> dict[str, Any]:
    pairs, tokens = _pairs(request, body)
    data = [{"index": i, "object": "score", "score": _similarity(a, b)} for i, (a, b) in enumerate(pairs)]
    return _listing(request, "score", data, tokens)


def _rerank(request: web.Request, body: dict[str, Any]) -> dict[str, Any]:
    query = body.get("query")
    documents = body.get("documents")
    if not isinstance(query, str) or not query:
        raise BadRequestError("`query` must be a non-empty string", param="query")
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise BadRequestError("`documents` must be a non-empty list of strings", param="documents")
    top_n = body.get("top_n") or len(documents)
    if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0:
        raise BadRequestError("`top_n` must be a non-negative integer", param="top_n")
    q = _tokens(request, query)
    encoded = [_tokens(request, d) for d in documents]
    ranked = sorted(
        ((_similarity(q, t), i, d) for i, (d, t) in enumerate(zip(documents, encoded))), key=lambda scored: -scored[0]
    )[:top_n]
    results = [{"index": i, "document": {"text": d}, "relevance_score": score} for score, i, d in ranked]
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": request.app[CONFIG].model,
        "usage": {"total_tokens": len(q) * len(documents) + sum(map(len, encoded))},
        "results": results,
    }
