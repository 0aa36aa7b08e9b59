"""Reloads with a Redis-shared index leak nothing: 20 routing changes under load, then Redis's
own view (CLIENT LIST, PUBSUB NUMSUB/CHANNELS) and the gateway's RSS are back where they were.

Each reload changes the pool's routing section, so each builds a new router with a new Redis
index while streams on the old one are still running; the old index must be closed once the last
of them ends, and must not come back to life when one of them records its answer afterwards.
Redis is sampled 0.25 s after every reload too (old indexes must be gone by then, not at the next
garbage collection), and a last reload with nothing in flight must leave no index connection at all.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
import redis

from tests.integration.gateway_procs import MODEL, Gateway, pool, running, start_gateway, start_stub
from tests.integration.reliability_tools import Outcome, RedisServer, chat, eventually, post_until, report
from tests.integration.test_reliability_fuzz import rss_kb

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
RELOADS = 20
CLIENTS = 4
CHANNEL = f"affinity:{MODEL}:ops"
MAX_RSS_GROWTH_KB = 4 * 1024


def _redis_view(client: redis.Redis) -> tuple[list[str], int, list[bytes]]:
    """The gateway's connections (by name; the test's own excluded), subscribers, channels."""
    me = client.client_id()
    names = sorted(c["name"] or "-" for c in client.client_list() if int(c["id"]) != me)
    return names, dict(client.pubsub_numsub(CHANNEL))[CHANNEL.encode()], sorted(client.pubsub_channels())


def _owners(names: list[str]) -> set[str]:
    """Which index each connection belongs to: its name less the role (an unnamed one: "-")."""
    return {name.rsplit(":", 2)[-2] if name.count(":") >= 2 else name for name in names}


def _settled(client: redis.Redis, timeout_s: float) -> tuple[tuple[list[str], int, list[bytes]], float]:
    """Redis's view once one subscriber is left (or at the timeout), and how long that took."""
    start = time.monotonic()
    view = _redis_view(client)
    while view[1] != 1 and time.monotonic() - start < timeout_s:
        time.sleep(0.1)
        view = _redis_view(client)
    return view, round(time.monotonic() - start, 2)


def _load(url: str, stop: threading.Event, outcomes: list[Outcome], n: int) -> None:
    """Streams of a few hundred ms one after the other, so every reload finds some in flight."""
    post_until(url, stop, outcomes, lambda i: chat(f"shared system prompt {n % 2} " * 20 + f"turn {i}", 12, True))


def _reload(gateway: Gateway, block_chars: int) -> None:
    data = {**gateway.data}
    data["pools"][MODEL]["routing"] = {"policy": "prefix_affinity", "prefix": {"block_chars": block_chars}}
    gateway.rewrite(data)
    answer = httpx.post(f"{gateway.url}/admin/reload", timeout=10)
    assert answer.status_code == 200, answer.text


def test_twenty_reloads_under_load_release_every_redis_client_and_subscription(tmp_path: Path) -> None:
    redis_server = RedisServer().start()
    outcomes: list[Outcome] = []
    stop = threading.Event()
    client = redis.Redis(port=redis_server.port)
    try:
        with running() as track:
            stubs = [track(start_stub(f"replica-{i}", speedup=40)) for i in range(2)]
            pools = {MODEL: {**pool(*((s.replica_id, s.url) for s in stubs)),
                             "routing": {"policy": "prefix_affinity"}}}
            gateway = track(start_gateway(tmp_path, pools, state={"store": redis_server.url},
                                          logging={"requests": False}))
            threads = [threading.Thread(target=_load, args=(gateway.url, stop, outcomes, n)) for n in range(CLIENTS)]
            for t in threads:
                t.start()
            eventually(lambda: len(outcomes) >= 8, timeout_s=20)
            _reload(gateway, 65)  # warm-up: the first reload's allocations are not a leak
            before, settle_s = _settled(client, timeout_s=10)
            before_rss = rss_kb(gateway)
            during: list[tuple[int, int]] = []  # (subscribers, index owners) 0.25 s after each reload
            for i in range(RELOADS):
                _reload(gateway, 64 + (i % 2) * 2)  # 64 / 66: a different routing section each time
                time.sleep(0.25)  # streams started on this router are in flight at the next reload
                names, subscribers, _ = _redis_view(client)
                during.append((subscribers, len(_owners([n for n in names if not n.startswith("affinity-gateway-")]))))
            stop.set()
            for t in threads:
                t.join(30)
            after, released_s = _settled(client, timeout_s=10)
            after_rss = rss_kb(gateway)
            _reload(gateway, 70)  # nothing in flight: the last router goes at once, and nothing starts again
            idle = _redis_view(client)
            report("reloads_redis", outcomes, reloads=RELOADS, clients_before=len(before[0]),
                   clients_after=len(after[0]), owners_after=sorted(_owners(after[0])), subscribers_before=before[1],
                   subscribers_after=after[1], released_s=released_s, rss_before_kb=before_rss,
                   rss_after_kb=after_rss, warmup_settle_s=settle_s, most_during=list(map(max, zip(*during))),
                   idle_reload=idle[0])
            # A router's streams last ~30 ms: 0.25 s after a reload only it and the one it replaced may be left.
            assert all(subscribers <= 2 and owners <= 2 for subscribers, owners in during), during
            assert after[1] == 1, f"{after[1]} subscribers on {CHANNEL}: old indexes still follow it"
            own = [n for n in after[0] if n.startswith("affinity-gateway-")]  # the app's usage counters: no reload's
            index = [n for n in after[0] if not n.startswith("affinity-gateway-")]
            assert len(_owners(index)) == 1, after[0]
            assert len(own) <= 2, after[0]  # the usage flush and a reader at most, however many reloads
            # one index: a reader per concurrent lookup, the writer's flush, snapshot and marker, the subscription
            assert len(index) <= CLIENTS + 4, after[0]
            assert after[2] == before[2] == [CHANNEL.encode()]
            assert after_rss - before_rss < MAX_RSS_GROWTH_KB
            assert idle[1] == 0 and idle[2] == [], idle  # no subscription left, no index connection left:
            assert all(n.startswith("affinity-gateway-") for n in idle[0]), idle[0]  # only the app's own
            assert outcomes and all(o.clean for o in outcomes), [o for o in outcomes if not o.clean][:3]
    finally:
        stop.set()
        client.close()
        redis_server.stop()
