"""The lab's engine-aware oracle as a router process: `bench --compare oracle` in front of live sim stubs.

Not a product: a yardstick. For every generation request it asks each replica for its own forecast of the
request's time to first token (the sim stub's `POST /debug/forecast_ttft`: the replica's true scheduler
state and step cost, replayed forward) and sends the request where that is lowest; ties go to the replica
with the fewest of this router's requests in flight. It sees what no gateway can, so the gap between it and
prefix_affinity, measured in one run with the same workload, is the headroom a better gateway could win
(inside the simulator the same forecast is `lab.oracle`). Anything else (models, health) goes round robin.

It takes the peers' command line (`lab.peers`: `--host --port --worker-urls ... --policy engine`; the
Prometheus and log flags are accepted and ignored) so the bench starts it like any other contestant.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
from collections.abc import Sequence

import aiohttp
from aiohttp import web

from gateway.errors import error_body

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")
HOP_BY_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
FORECAST_TIMEOUT = aiohttp.ClientTimeout(total=10)


class OracleRouter:
    """Routes by the replicas' own TTFT forecasts; one aiohttp client session to all of them."""

    def __init__(self, replicas: Sequence[str]) -> None:
        self.replicas = [url.rstrip("/") for url in replicas]
        self.in_flight = [0] * len(self.replicas)
        self._turn = itertools.cycle(range(len(self.replicas)))
        self._session: aiohttp.ClientSession | None = None

    async def start(self, app: web.Application) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )

    async def stop(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    async def forecast(self, index: int, body: bytes, headers: dict[str, str]) -> float | None:
        """Replica `index`'s forecast TTFT for `body`; infinite when it cannot say (down, not a sim stub), None
        when it refused the request itself (a 400: the replica would refuse to serve it too)."""
        assert self._session is not None
        try:
            async with self._session.post(
                f"{self.replicas[index]}/debug/forecast_ttft", data=body, headers=headers, timeout=FORECAST_TIMEOUT
            ) as answer:
                if answer.status == 400:
                    return None
                if answer.status != 200:
                    return math.inf
                return float((await answer.json())["ttft_s"])
        except (aiohttp.ClientError, TimeoutError, KeyError, ValueError):
            return math.inf

    async def pick(self, body: bytes, headers: dict[str, str]) -> int | None:
        """The replica with the lowest forecast (ties: fewest in flight, then the lowest index); a replica that
        refused the request, so that the client gets that replica's own error; None if none could forecast."""
        forecasts = await asyncio.gather(*(self.forecast(i, body, headers) for i in range(len(self.replicas))))
        if None in forecasts:
            return forecasts.index(None)
        ttfts = [t for t in forecasts if t is not None]  # all of them: typed as floats
        best = min(ttfts)
        if best == math.inf:
            return None
        return min((i for i, t in enumerate(ttfts) if t <= best + 1e-9), key=lambda i: self.in_flight[i])

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        if request.method == "POST" and request.path in GENERATION_PATHS:
            index = await self.pick(body, headers)
            if index is None:
                return _error(503, "no replica could forecast this request (are they sim stubs?)")
        else:
            index = next(self._turn)
        self.in_flight[index] += 1
        try:
            return await self._relay(request, index, body, headers)
        finally:
            self.in_flight[index] -= 1

    async def _relay(
        self, request: web.Request, index: int, body: bytes, headers: dict[str, str]
    ) -> web.StreamResponse:
        """The replica's answer, chunk by chunk as it comes. A replica that fails before its answer began is a
        502; one that breaks off mid-answer drops the client's connection (a broken answer, never a short one
        that looks complete)."""
        assert self._session is not None
        url = f"{self.replicas[index]}{request.path_qs}"
        response: web.StreamResponse | None = None
        try:
            async with self._session.request(request.method, url, data=body or None, headers=headers) as upstream:
                back = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=back)
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientError as exc:
            if response is not None and response.prepared:
                raise
            return _error(502, f"replica {self.replicas[index]} failed: {type(exc).__name__}")


def _error(status: int, message: str) -> web.Response:
    kind = "ServiceUnavailableError" if status == 503 else "BadGatewayError"
    return web.Response(status=status, body=error_body(message, kind, status), content_type="application/json")


def build_app(replicas: Sequence[str]) -> web.Application:
    router = OracleRouter(replicas)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_startup.append(router.start)
    app.on_cleanup.append(router.stop)
    app.router.add_route("*", "/{tail:.*}", router.handle)
    return app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.oracle_router", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--worker-urls", nargs="+", required=True, help="the sim stubs' base URLs")
    parser.add_argument("--policy", default="engine", choices=["engine"], help="the one policy: the engine's forecast")
    parser.add_argument("--prometheus-host", help="accepted, ignored (the peers' command line)")
    parser.add_argument("--prometheus-port", help="accepted, ignored")
    parser.add_argument("--log-level", default="error", help="accepted, ignored")
    args = parser.parse_args(argv)
    web.run_app(build_app(args.worker_urls), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
