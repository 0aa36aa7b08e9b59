"""The upstream send: requests to replicas on the gateway's own HTTP/1.1 client.

Why not aiohttp's client: per proxied request it cost about as much CPU as everything else the gateway
does. A bare aiohttp reverse proxy spent 0.22 ms of CPU per request in the hop benchmark and the same
proxy on a raw asyncio protocol 0.10 ms (docs/benchmarks/hop.md): `ClientResponse`, its `StreamReader`,
the connector's bookkeeping, `yarl` URLs and request info objects are built for every request, for
features a proxy to a known replica never uses (redirects, cookies, proxies, decompression, traces).
Here a request is one formatted head and one write; its answer is parsed by llhttp (httptools) into a
status, a `CIMultiDict` of headers and body pieces (`connection`); connections are kept alive per
replica (`client`).

The gateway's other calls to replicas (health probes, load scrapes, `/v1/models`, stored responses) stay
on its aiohttp `ClientSession`: they are few, and aiohttp's client is the better general tool.
"""

from gateway.relay.upstream.client import KEEPALIVE_S, Upstream
from gateway.relay.upstream.connection import Dropped, NoConnection, UpstreamAnswer, UpstreamFailure

__all__ = ["KEEPALIVE_S", "Dropped", "NoConnection", "Upstream", "UpstreamAnswer", "UpstreamFailure"]
