"""The keys under which a request carries its id and its caller, set by the app's middlewares before any
handler runs, read by the proxied routes and the gateway's own alike."""

from __future__ import annotations

from aiohttp import web

from gateway.request.caller import Caller

REQUEST_ID = web.RequestKey("request_id", str)
CALLER = web.RequestKey("caller", Caller)
