"""What the fleet's response homes (`gateway.relay.shared_homes`) cost a request.

Three figures, against a real redis-server at `--redis`:
- `locate` for a request that continues no response (every chat request, every new response): the
  event-loop CPU the request path pays for the feature;
- `finished` for an answer that stored a response: the local table plus queueing the home for the
  background writer (the write itself is not on the request path; its Redis time is shown apart);
- `locate` for a follow-up whose home another gateway wrote: one GET, the latency a follow-up through
  a gateway that did not make its response waits, p50/p99.

    .venv/bin/python -m bench.response_homes_cost --redis redis://127.0.0.1:6379/0 [--n 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

from gateway.relay.shared_homes import SharedHomes
from gateway.relay.stored_responses import ResponseHomes
from gateway.view import RequestView


def _view(endpoint: str, previous: str | None) -> RequestView:
    body: dict[str, Any] = {"model": "m", "input": "x", **({"previous_response_id": previous} if previous else {})}
    return RequestView("r", endpoint, "m", False, body, b"{}")


class _Route:
    model = "m"
    pool: list[Any] = []


async def main(url: str, n: int) -> None:
    prefix = f"bench-{uuid.uuid4().hex}:"
    writer, reader = SharedHomes(url, prefix, 600.0), SharedHomes(url, prefix, 600.0)
    homes, other = ResponseHomes(shared=writer), ResponseHomes(shared=reader)
    route: Any = _Route()
    chat = _view("chat", None)
    started = time.perf_counter()
    for _ in range(n):
        await homes.locate(chat, route, None, None, {})  # type: ignore[arg-type]
    print(f"locate, no follow-up: {(time.perf_counter() - started) / n * 1e6:.2f} µs per request")
    ids = [f"resp_{i}" for i in range(n)]
    started = time.perf_counter()
    for response_id in ids:
        homes.remember(response_id, "m", "r0")
    print(f"finished with a stored response (table + queue): {(time.perf_counter() - started) / n * 1e6:.2f} µs")
    started = time.perf_counter()
    await writer.flush()
    print(
        f"background write of {n} homes (pipelines of 500): {(time.perf_counter() - started) / n * 1e6:.2f} µs "
        "per home (off the request path)"
    )
    waits = []
    for response_id in ids[-2000:]:  # the newest: at most MAX_PENDING wait for the writer
        t = time.perf_counter()
        await other.locate(_view("responses", response_id), route, None, None, {})  # type: ignore[arg-type]
        waits.append(time.perf_counter() - t)
    q = statistics.quantiles(waits, n=100)
    print(f"locate, follow-up found in Redis (one GET): p50 {q[49] * 1e3:.3f} ms, p99 {q[98] * 1e3:.3f} ms")
    await writer.close()
    await reader.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", required=True)
    parser.add_argument("--n", type=int, default=20000)
    args = parser.parse_args()
    asyncio.run(main(args.redis, args.n))
