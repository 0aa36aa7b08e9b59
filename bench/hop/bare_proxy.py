"""The reference contestant of the hop benchmark, not a product: the barest aiohttp reverse proxy
(aiohttp server and client, round robin, uvloop, no other logic). It is the floor that the
gateway's own work is measured against.

    python -m bench.hop.bare_proxy --port 9000 --replica http://127.0.0.1:9001 [--replica ...]
"""

from __future__ import annotations

import argparse
import itertools

import aiohttp
import uvloop
from aiohttp import web

HOP_BY_HOP = {"host", "content-length", "transfer-encoding", "connection"}


def build_app(replicas: list[str]) -> web.Application:
    turn = itertools.cycle(replicas)
    app = web.Application()

    async def start(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def stop(app: web.Application) -> None:
        await app["session"].close()

    async def proxy(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with app["session"].request(
            request.method, next(turn) + request.path_qs, headers=headers, data=await request.read()
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_route("*", "/{tail:.*}", proxy)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.hop.bare_proxy", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--replica", action="append", required=True)
    args = parser.parse_args()
    uvloop.install()
    web.run_app(build_app(args.replica), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
