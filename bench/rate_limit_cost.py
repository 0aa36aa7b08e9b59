"""What a rate-limited key's admission costs the request path (`gateway.edge.rate_limits`).

- in memory (no shared Redis, or Redis down): the sliding window, with a fake clock advancing 20 ms per
  admission so every bucket of the window holds counts and the window moves every 50 admissions;
- with a shared Redis at `--redis`: leases (a twentieth of a large quota), so most admissions spend
  locally and one in many draws from Redis (its round trip included in the mean).

    .venv/bin/python -m bench.rate_limit_cost --redis redis://127.0.0.1:6379/0 [--n 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from types import SimpleNamespace
from unittest.mock import patch

from gateway.config.features import ApiKeyConfig
from gateway.edge.auth import hash_key
from gateway.edge.rate_limits import RateLimits
from gateway.edge.shared_quota import SharedQuota


async def main(url: str, n: int) -> None:
    key = ApiKeyConfig(sha256=hash_key("k"), tenant="t", requests_per_minute=10**7, tokens_per_minute=10**9)
    clock = [1000.0]

    def ticking() -> float:
        clock[0] += 0.02
        return clock[0]

    local = RateLimits()
    with patch("gateway.edge.rate_limits.time", SimpleNamespace(monotonic=ticking, time=time.time)):
        started = time.perf_counter()
        for _ in range(n):
            await local.admit(key, 100)
        print(f"in memory, spread over the window: {(time.perf_counter() - started) / n * 1e6:.2f} µs per admission")
    shared = RateLimits(SharedQuota(url, f"bench-{uuid.uuid4().hex}:"))
    started = time.perf_counter()
    for _ in range(n):
        await shared.admit(key, 100)
    print(f"shared (leases from Redis): {(time.perf_counter() - started) / n * 1e6:.2f} µs per admission")
    assert shared.shared is not None
    await shared.shared.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", required=True)
    parser.add_argument("--n", type=int, default=50000)
    args = parser.parse_args()
    asyncio.run(main(args.redis, args.n))
