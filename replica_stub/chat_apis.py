"""The other generating APIs vLLM serves, on the stub's engine: Anthropic `/v1/messages` and the
OpenAI Responses API `/v1/responses`, both whole and streamed, in the shapes their SDKs parse.

Each request becomes a chat request (system/instructions first, then the turns; tool blocks and
other items as their JSON), so it is tokenized, cached and scheduled exactly like a chat
completion, and `usage` carries the cached prompt tokens. A response is stored unless the request
says `store: false` (vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1): `GET /v1/responses/{id}` returns
it, and a request with `previous_response_id` continues its conversation; an id this replica never
stored gets vLLM's 404, which is why such requests must reach the replica that stored it.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

import orjson
from aiohttp import web

from gateway.errors import BadRequestError, NotFoundError
from replica_stub.generation import ARRIVALS, CONFIG, generation
from replica_stub.output import RequestStream
from replica_stub.protocol import check_model, parse_chat

ReadBody = Callable[[web.Request], Awaitable[dict[str, Any]]]
_STOP = {"stop": "end_turn", "length": "max_tokens"}
MAX_STORED = 10_000  # responses kept per replica, oldest dropped first
Store = OrderedDict[str, tuple[dict[str, Any], list[dict[str, Any]]]]  # id -> (response, its conversation)
STORE = web.AppKey("stored_responses", Store)


def add_routes(app: web.Application, read_body: ReadBody) -> None:
    async def messages(request: web.Request) -> web.StreamResponse:
        return await _serve(request, await read_body(request), _messages_chat, _Anthropic)

    async def responses(request: web.Request) -> web.StreamResponse:
        return await _serve(request, await read_body(request), partial(_responses_chat, request.app[STORE]), _Responses)

    async def stored(request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        found = request.app[STORE].get(response_id)
        if found is None:
            raise NotFoundError(f"Response with id '{response_id}' not found.", param="response_id")
        return web.Response(body=orjson.dumps(found[0]), content_type="application/json")

    app[STORE] = OrderedDict()
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/responses", responses)
    app.router.add_get("/v1/responses/{response_id}", stored)
    app.router.add_post("/v1/responses/{response_id}/cancel", stored)  # finished already: vLLM returns it as is


def _text(content: Any) -> Any:
    """Text blocks/parts as chat text parts; anything else (tool use, images) as its JSON."""
    if isinstance(content, str) or content is None:
        return content or ""
    if not isinstance(content, list):
        raise BadRequestError("`content` must be a string or a list of blocks", param="messages")
    return [
        {"type": "text", "text": part["text"]}
        if isinstance(part, dict)
        and part.get("type") in ("text", "input_text", "output_text")
        and isinstance(part.get("text"), str)
        else {"type": "text", "text": orjson.dumps(part).decode()}
        for part in content
    ]


def _messages_chat(body: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(body.get("max_tokens"), int):
        raise BadRequestError("`max_tokens` is required (an integer)", param="max_tokens")
    system = body.get("system")
    turns = [{"role": "system", "content": _text(system)}] if system else []
    for i, message in enumerate(body.get("messages") or []):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise BadRequestError(f"messages[{i}] must be a user or assistant message", param="messages")
        turns.append({"role": message["role"], "content": _text(message.get("content"))})
    return {
        "messages": turns,
        "max_tokens": body["max_tokens"],
        "stream": body.get("stream", False),
        **{k: body[k] for k in ("temperature", "top_p") if k in body},
        **({"stop": body["stop_sequences"]} if body.get("stop_sequences") else {}),
    }


def _responses_chat(store: Store, body: dict[str, Any]) -> dict[str, Any]:
    instructions = body.get("instructions")
    turns = [{"role": "system", "content": instructions}] if isinstance(instructions, str) and instructions else []
    if previous := body.get("previous_response_id"):
        if previous not in store:
            raise NotFoundError(f"Response with id '{previous}' not found.", param="previous_response_id")
        turns += [t for t in store[previous][1] if t["role"] != "system"]  # instructions are not carried over
    given = body.get("input")
    if isinstance(given, str):
        turns.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for item in given:
            if isinstance(item, dict) and isinstance(item.get("role"), str):
                turns.append({"role": item["role"], "content": _text(item.get("content"))})
            else:
                turns.append({"role": "user", "content": orjson.dumps(item).decode()})
    else:
        raise BadRequestError("`input` must be a string or a list of items", param="input")
    return {
        "messages": turns,
        "stream": body.get("stream", False),
        **({"max_tokens": body["max_output_tokens"]} if body.get("max_output_tokens") else {}),
        **{k: body[k] for k in ("temperature", "top_p") if k in body},
    }


async def _serve(
    http: web.Request, body: dict[str, Any], as_chat: Callable[[dict[str, Any]], dict[str, Any]], shape: type[_Shape]
) -> web.StreamResponse:
    config = http.app[CONFIG]
    await http.app[ARRIVALS].enter()
    check_model(body, config.model)
    chat = as_chat(body)
    gen = parse_chat(chat)
    fmt = shape(config.model, body)
    fmt.turns, fmt.store = chat["messages"], http.app[STORE]
    async with generation(http, gen) as stream:
        if not gen.stream:
            text = "".join([d.text async for batch in stream.batches() for d in batch])
            return web.Response(body=orjson.dumps(fmt.whole(text, stream)), content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(http)
        try:
            async for events in fmt.events(stream):
                await response.write(events)
            await response.write_eof()
        except ConnectionResetError:
            pass
        return response


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class _Shape:
    def __init__(self, model: str, body: dict[str, Any]) -> None:
        self.model, self.body, self.id = model, body, uuid.uuid4().hex
        self.turns: list[dict[str, Any]] = []  # the conversation the answer continues
        self.store: Store = OrderedDict()

    def whole(self, text: str, stream: RequestStream) -> dict[str, Any]:
        raise NotImplementedError

    def events(self, stream: RequestStream) -> AsyncIterator[bytes]:
        raise NotImplementedError


class _Anthropic(_Shape):
    def _message(self, text: str, stream: RequestStream, done: bool) -> dict[str, Any]:
        request = stream.request
        usage = {
            "input_tokens": request.num_prompt_tokens,
            "output_tokens": stream.num_output_tokens if done else 0,
            "cache_read_input_tokens": request.num_cached_tokens or 0,
        }
        return {
            "id": f"msg_{self.id}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [{"type": "text", "text": text}] if done else [],
            "stop_reason": _STOP.get(stream.finish_reason or "", "end_turn") if done else None,
            "stop_sequence": None,
            "usage": usage,
        }

    def whole(self, text: str, stream: RequestStream) -> dict[str, Any]:
        return self._message(text, stream, True)

    async def events(self, stream: RequestStream) -> AsyncIterator[bytes]:
        start = _sse("message_start", {"type": "message_start", "message": self._message("", stream, False)}) + _sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        )
        async for batch in stream.batches():  # the first bytes once the prefill is done, as vLLM's
            yield start + b"".join(
                _sse(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": d.text}},
                )
                for d in batch
                if d.text
            )
            start = b""
        yield (
            _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
            + _sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": _STOP.get(stream.finish_reason or "", "end_turn"), "stop_sequence": None},
                    "usage": {"output_tokens": stream.num_output_tokens},
                },
            )
            + _sse("message_stop", {"type": "message_stop"})
        )


class _Responses(_Shape):
    def __init__(self, model: str, body: dict[str, Any]) -> None:
        super().__init__(model, body)
        self.created, self.seq = int(time.time()), 0

    def _item(self, text: str, status: str) -> dict[str, Any]:
        return {
            "type": "message",
            "id": f"msg_{self.id}",
            "status": status,
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else [],
        }

    def _response(self, text: str | None, stream: RequestStream) -> dict[str, Any]:
        request, done = stream.request, text is not None
        status = "in_progress" if not done else "incomplete" if stream.finish_reason == "length" else "completed"
        usage = (
            {
                "input_tokens": request.num_prompt_tokens,
                "input_tokens_details": {"cached_tokens": request.num_cached_tokens or 0},
                "output_tokens": stream.num_output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": request.num_prompt_tokens + stream.num_output_tokens,
            }
            if done
            else None
        )
        return {
            "id": f"resp_{self.id}",
            "object": "response",
            "created_at": self.created,
            "model": self.model,
            "status": status,
            "output": [self._item(text, "completed")] if text is not None else [],
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": self.body.get("instructions"),
            "max_output_tokens": self.body.get("max_output_tokens"),
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": self.body.get("tools") or [],
            "temperature": self.body.get("temperature", 1.0),
            "top_p": self.body.get("top_p", 1.0),
            "previous_response_id": self.body.get("previous_response_id"),
            "reasoning": None,
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "error": None,
            "metadata": {},
            "usage": usage,
        }

    def whole(self, text: str, stream: RequestStream) -> dict[str, Any]:
        return self._stored(self._response(text, stream), text)

    def _stored(self, response: dict[str, Any], text: str) -> dict[str, Any]:
        if self.body.get("store", True):
            self.store[response["id"]] = (response, [*self.turns, {"role": "assistant", "content": text}])
            while len(self.store) > MAX_STORED:
                self.store.popitem(last=False)
        return response

    def _event(self, kind: str, **fields: Any) -> bytes:
        self.seq += 1
        return _sse(kind, {"type": kind, "sequence_number": self.seq - 1, **fields})

    async def events(self, stream: RequestStream) -> AsyncIterator[bytes]:
        where = {"item_id": f"msg_{self.id}", "output_index": 0}
        parts: list[str] = []
        async for batch in stream.batches():  # the first bytes once the prefill is done
            start = (
                b""
                if parts
                else (
                    self._event("response.created", response=self._response(None, stream))
                    + self._event("response.in_progress", response=self._response(None, stream))
                    + self._event("response.output_item.added", output_index=0, item=self._item("", "in_progress"))
                    + self._event(
                        "response.content_part.added",
                        **where,
                        content_index=0,
                        part={"type": "output_text", "text": "", "annotations": []},
                    )
                )
            )
            parts += (d.text for d in batch if d.text)
            yield start + b"".join(
                self._event("response.output_text.delta", **where, content_index=0, delta=d.text, logprobs=[])
                for d in batch
                if d.text
            )
        text = "".join(parts)
        yield (
            self._event("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
            + self._event(
                "response.content_part.done",
                **where,
                content_index=0,
                part={"type": "output_text", "text": text, "annotations": []},
            )
            + self._event("response.output_item.done", output_index=0, item=self._item(text, "completed"))
            + self._event("response.completed", response=self._stored(self._response(text, stream), text))
        )
