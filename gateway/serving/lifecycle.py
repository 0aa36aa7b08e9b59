"""Serving and graceful shutdown: SIGTERM stops new work, lets accepted requests finish, then exits.

    SIGTERM/SIGINT → /ready answers 503 ("draining") → after `shutdown.ready_delay_s` the listener
    closes (new connections are refused; idle keep-alive connections are closed) → requests already
    accepted, streams included, run to completion for up to `shutdown.grace_s` → then every stream
    still open ends with the SSE error event and `[DONE]` (`gateway.relay.watch`), and whatever is left after
    `CUT_S` more is closed (its upstream request with it) → background tasks stop. The process exits
    within `ready_delay_s + grace_s + CUT_S` plus the background tasks' own stop.

The ready delay exists for load balancers that poll /ready: they stop sending before the port
closes. The HTTP server's own limits are set here too: header line size and count, and the
header deadline (aiohttp's keep-alive timer, which also runs from the moment a connection opens,
so a client dribbling its headers — slowloris — is cut off after `limits.client_header_timeout_s`).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
from aiohttp import web

from gateway import native
from gateway.serving.http_server import GatewayRunner

if TYPE_CHECKING:
    from gateway.config.loader import Config
from gateway.support.fd_limit import raise_limit
from gateway.support.heap import settle_heap

log = structlog.get_logger("gateway.serving.lifecycle")
CUT_S = 0.5  # after the grace period: time for cut streams to write their error event before connections close


class Lifecycle:
    """Mutable for the app's life: set once SIGTERM arrives."""

    draining: bool = False
    cut_streams: Callable[[str], object] = staticmethod(lambda message: None)  # set by the app: ends open streams


LIFECYCLE = web.AppKey("lifecycle", Lifecycle)


def serve(app: web.Application, config: Config, *, reuse_port: bool = False, private_socket: str | None = None) -> None:
    """Run until SIGTERM/SIGINT, then drain; uvloop if installed. A worker of `serve --workers N`
    shares the port (`reuse_port`) and answers its siblings on a Unix socket of its own (gateway.serving.workers)."""
    raise_limit()  # two descriptors per request in flight: the soft limit of 1,024 is a few hundred requests
    factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        pass
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_serve(app, config, reuse_port, private_socket))


async def _serve(
    app: web.Application, config: Config, reuse_port: bool = False, private_socket: str | None = None
) -> None:
    limits = config.limits
    grace_s = config.shutdown.grace_s
    runner = GatewayRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=grace_s + 2 * CUT_S,
        keepalive_timeout=limits.client_header_timeout_s,
        max_line_size=limits.max_header_bytes,
        max_field_size=limits.max_header_bytes,
        max_headers=limits.max_headers,
    )
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, config.listen.host, config.listen.port, reuse_port=reuse_port or None).start()
        except OSError as exc:  # port taken, address not local: one clear event, exit 1
            log.error("gateway_listen_failed", host=config.listen.host, port=config.listen.port, error=str(exc))
            raise SystemExit(1) from None
        if private_socket is not None:
            if not private_socket.startswith("\0"):  # a path (not an abstract name): left by a crashed predecessor
                Path(private_socket).unlink(missing_ok=True)
            await web.UnixSite(runner, private_socket).start()
        settle_heap()  # what start-up built is out of the collector's sight from here on
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info(
            "gateway_listening",
            host=config.listen.host,
            port=config.listen.port,
            models=sorted(config.pools),
            policies={m: p.routing.policy for m, p in config.pools.items()},
            compiled_modules=f"{len(native.compiled())}/{len(native.HOT_MODULES)}",  # gateway.native
        )
        await stop.wait()
        app[LIFECYCLE].draining = True
        log.info("gateway_draining", ready_delay_s=config.shutdown.ready_delay_s, grace_s=config.shutdown.grace_s)
        await asyncio.sleep(config.shutdown.ready_delay_s)
        loop.call_later(grace_s, _cut_off, app, runner)
    finally:
        await runner.cleanup()
    log.info("gateway_stopped")


def _cut_off(app: web.Application, runner: web.AppRunner) -> None:
    """The grace period is over: open streams end with the error event, then every connection closes
    (aiohttp's own shutdown would wait `shutdown_timeout` once more for handlers it does not cancel)."""
    log.warning("gateway_grace_over", connections=len(runner.server.connections) if runner.server else 0)
    app[LIFECYCLE].cut_streams("the gateway is shutting down")
    if runner.server is not None:
        asyncio.get_running_loop().call_later(CUT_S, _close_all, runner.server)


def _close_all(server: web.Server) -> None:
    for connection in server.connections:
        connection.force_close()  # handler_cancellation: the handler is cancelled, its upstream closed
