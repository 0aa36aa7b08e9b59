"""The application's shared parts, by key: one module, so that the request handler (`gateway.serving.app`)
and the ops handlers (`gateway.admin.ops_routes`) reach the same objects without importing each other."""

from __future__ import annotations

from aiohttp import web

from gateway.edge.rate_limits import RateLimits
from gateway.insights.prefix_report import PrefixReport
from gateway.insights.sessions import Sessions
from gateway.insights.token_costs import TokenCosts
from gateway.observability.decision_log import DecisionLog
from gateway.observability.metrics import Metrics
from gateway.observability.tracing import Tracing
from gateway.relay.proxy import Proxy
from gateway.relay.stored_responses import ResponseHomes
from gateway.replicas.health import Monitor
from gateway.replicas.shared_monitor import Follower
from gateway.request.observers import Observers
from gateway.routing.route_table import RouteTable
from gateway.serving.admission import Admission

ROUTE_TABLE = web.AppKey("route_table", RouteTable)
METRICS = web.AppKey("metrics", Metrics)
PROXY = web.AppKey("proxy", Proxy)
ADMISSION = web.AppKey("admission", Admission)
RATE_LIMITS = web.AppKey("rate_limits", RateLimits)
HOMES = web.AppKey("response_homes", ResponseHomes)
TOKEN_COSTS = web.AppKey("token_costs", TokenCosts)
SESSIONS = web.AppKey("sessions", Sessions)
PREFIX_REPORT = web.AppKey("prefix_report", PrefixReport)
DECISIONS = web.AppKey("decisions", DecisionLog)
OBSERVERS = web.AppKey("observers", Observers)  # who hears of every request (gateway.request.observers)
TRACING: web.AppKey[Tracing | None] = web.AppKey("tracing")  # None: tracing off
MONITOR = web.AppKey("monitor", Monitor)  # health probes, load scrapes, model lists (set at start)
FOLLOWER: web.AppKey[Follower | None] = web.AppKey("follower")  # a worker taking worker 0's findings
