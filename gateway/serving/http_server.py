"""The aiohttp server the gateway runs on: every answer aiohttp gives on its own is in the OpenAI shape.

aiohttp answers some requests before any middleware runs: a request head it cannot parse (bad request
line, invalid method, header line too long: 400), an unknown `Expect` (417). Its own answers are plain
text; here they are OpenAI error JSON, still with `Connection: close` where aiohttp closes. Request
bodies are not decompressed by the server: `gateway.edge.encoding` decodes them under the body limits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from gateway.errors import http_error_body

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class _JSONErrors(RequestHandler):
    """One connection; its parse errors answered in the OpenAI shape."""

    __slots__ = ()

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; refuses once bytes of a response went out
        text = message if message and status != 500 else "internal gateway error"
        response = web.Response(
            status=status,
            body=http_error_body(status, text),
            content_type="application/json",
            headers={"Connection": "close"},
        )  # said outright: an unparsed head has no version
        response.force_close()
        return response


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        return _JSONErrors(self, loop=self._loop, **self._kwargs)


def _http_exceptions_as_json(handler: Handler) -> Handler:
    """aiohttp's HTTPExceptions raised outside the middlewares (the route's Expect check) as JSON."""

    async def wrapped(request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            response = web.Response(
                status=exc.status,
                body=http_error_body(exc.status, exc.text or exc.reason),
                content_type="application/json",
            )
            if not request.keep_alive or exc.status == 417:  # the body of an unanswered Expect may follow: close
                response.force_close()
            return response

    return wrapped


class GatewayRunner(web.AppRunner):
    """AppRunner whose server answers in JSON and leaves request bodies as sent (`auto_decompress=False`)."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        super().__init__(app, auto_decompress=False, **kwargs)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return _Server(
            _http_exceptions_as_json(server.request_handler),
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            **server._kwargs,
        )
