"""The application's shared parts, by key: one module, so that the request handler (`gateway.server`)
and the ops handlers (`gateway.ops_routes`) reach the same objects without importing each other."""

from __future__ import annotations

from aiohttp import web

from gateway.admission import Admission
from gateway.auth import Caller
from gateway.decision_log import DecisionLog
from gateway.metrics import Metrics
from gateway.prefix_report import PrefixReport
from gateway.proxy import Proxy
from gateway.ratelimit import RateLimits
from gateway.sessions import Sessions
from gateway.state import GatewayState
from gateway.stored_responses import ResponseHomes
from gateway.token_costs import TokenCosts
from gateway.tracing import Tracing

STATE = web.AppKey("state", GatewayState)
METRICS = web.AppKey("metrics", Metrics)
PROXY = web.AppKey("proxy", Proxy)
ADMISSION = web.AppKey("admission", Admission)
RATE_LIMITS = web.AppKey("rate_limits", RateLimits)
HOMES = web.AppKey("response_homes", ResponseHomes)
TOKEN_COSTS = web.AppKey("token_costs", TokenCosts)
SESSIONS = web.AppKey("sessions", Sessions)
PREFIX_REPORT = web.AppKey("prefix_report", PrefixReport)
DECISIONS = web.AppKey("decisions", DecisionLog)
TRACING: web.AppKey[Tracing | None] = web.AppKey("tracing")  # None: tracing off
REQUEST_ID = web.RequestKey("request_id", str)
CALLER = web.RequestKey("caller", Caller)
