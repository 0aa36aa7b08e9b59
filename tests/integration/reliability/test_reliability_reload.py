"""Reloads with a Redis-shared index leak nothing: 20 routing changes under load, then Redis's
own view (CLIENT LIST, PUBSUB NUMSUB/CHANNELS), the gateway's KV-event sockets and its RSS are
back where they were.

Each reload changes the pool's routing section, so each builds a new router with a new Redis
index (and new KV-event feeds) while streams on the old one are still running; the old index must
be closed once the last of them ends, and must not come back to life when one of them records its
answer afterwards. Redis is sampled 0.25 s after every reload too (old indexes must be gone by
then, not at the next garbage collection), and a last reload with nothing in flight must leave no
index connection at all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import redis

from tests.integration.gateway_procs import MODEL, Gateway, pool, running, start_gateway, start_stub
from tests.integration.reliability.test_reliability_fuzz import rss_kb
from tests.integration.reliability_tools import Outcome, RedisServer, chat, eventually, post_until, report
from tests.integration.routing.test_kv_events_routing import start_replica

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
RELOADS = 20
CLIENTS = 4
CHANNEL = f"affinity:{MODEL}:ops"
MAX_RSS_GROWTH_KB = 4 * 1024
# With KV-event feeds and a tokenizer per router: +2.0-3.2 MB per 20 reloads, +5.1 MB over 60 (slowing; Python's
# objects stay flat). Feeds left open: +8.3 MB and 44 sockets, which the socket count catches first.
MAX_RSS_GROWTH_KV_KB = 6 * 1024
View = tuple[list[str], int, list[bytes]]  # connection names, subscribers on CHANNEL, channels


def _redis_view(client: redis.Redis) -> View:
    """The gateway's connections (by name; the test's own excluded), subscribers, channels."""
    me = client.client_id()
    names = sorted(c["name"] or "-" for c in client.client_list() if int(c["id"]) != me)
    return names, dict(client.pubsub_numsub(CHANNEL))[CHANNEL.encode()], sorted(client.pubsub_channels())


def _owners(names: list[str]) -> set[str]:
    """Which index each connection belongs to: its name less the role (an unnamed one: "-")."""
    return {name.rsplit(":", 2)[-2] if name.count(":") >= 2 else name for name in names}


def _index_owners(names: list[str]) -> int:
    return len(_owners([n for n in names if not n.startswith("affinity-gateway-")]))


def _settled(client: redis.Redis, timeout_s: float) -> tuple[View, float]:
    """Redis's view once one subscriber is left and the channel list agrees (or at the timeout), and how long
    that took: the two are read one after the other, and a subscription that moves between them (a follower
    resubscribing) would show one subscriber and no channel."""
    start = time.monotonic()
    view = _redis_view(client)
    while (view[1] != 1 or view[2] != [CHANNEL.encode()]) and time.monotonic() - start < timeout_s:
        time.sleep(0.1)
        view = _redis_view(client)
    return view, round(time.monotonic() - start, 2)


@dataclass
class Run:
    """What 20 reloads under load left: Redis before, 0.25 s after each reload, after, after an idle reload."""

    outcomes: list[Outcome] = field(default_factory=list, repr=False)
    before: View = ([], 0, [])
    during: list[tuple[int, int]] = field(default_factory=list)  # (subscribers, index owners)
    after: View = ([], 0, [])
    idle: View = ([], 0, [])
    rss_before_kb: int = 0
    rss_after_kb: int = 0
    released_s: float = 0.0

    def report(self, name: str, **extra: Any) -> None:
        report(
            name,
            self.outcomes,
            reloads=RELOADS,
            clients_before=len(self.before[0]),
            clients_after=len(self.after[0]),
            owners_after=sorted(_owners(self.after[0])),
            subscribers_before=self.before[1],
            subscribers_after=self.after[1],
            released_s=self.released_s,
            rss_before_kb=self.rss_before_kb,
            rss_after_kb=self.rss_after_kb,
            most_during=list(map(max, zip(*self.during))),
            idle_reload=self.idle[0],
            **extra,
        )

    def check(self, max_rss_growth_kb: int = MAX_RSS_GROWTH_KB) -> None:
        # A router's streams last ~30 ms: 0.25 s after a reload only it and the one it replaced may be left.
        assert all(subscribers <= 2 and owners <= 2 for subscribers, owners in self.during), self.during
        assert self.after[1] == 1, f"{self.after[1]} subscribers on {CHANNEL}: old indexes still follow it"
        own = [n for n in self.after[0] if n.startswith("affinity-gateway-")]  # the app's usage counters
        index = [n for n in self.after[0] if not n.startswith("affinity-gateway-")]
        assert len(_owners(index)) == 1, self.after[0]
        assert len(own) <= 2, self.after[0]  # the usage flush and a reader at most, however many reloads
        # one index: a reader per concurrent lookup, the writer's flush, snapshot and marker, the subscription
        assert len(index) <= CLIENTS + 4, self.after[0]
        assert self.after[2] == self.before[2] == [CHANNEL.encode()]
        assert self.rss_after_kb - self.rss_before_kb < max_rss_growth_kb
        assert self.idle[1] == 0 and self.idle[2] == [], self.idle  # no subscription, no index connection left:
        assert all(n.startswith("affinity-gateway-") for n in self.idle[0]), self.idle[0]  # only the app's own
        assert self.outcomes and all(o.clean for o in self.outcomes), [o for o in self.outcomes if not o.clean][:3]


def _reloads_under_load(
    gateway: Gateway,
    client: redis.Redis,
    routing: Callable[[int], dict[str, Any]],
    sample: Callable[[], None] = lambda: None,
) -> Run:
    """CLIENTS streaming clients; a warm-up reload, then RELOADS reloads 0.25 s apart with `routing(i)`
    (each different from the last), `sample()` after each; then the load stops and one idle reload."""
    run, stop = Run(), threading.Event()
    body = lambda n: lambda i: chat(f"shared system prompt {n % 2} " * 20 + f"turn {i}", 12, True)  # noqa: E731
    threads = [
        threading.Thread(target=post_until, args=(gateway.url, stop, run.outcomes, body(n))) for n in range(CLIENTS)
    ]
    try:
        for t in threads:
            t.start()
        eventually(lambda: len(run.outcomes) >= 8, timeout_s=20)
        _reload(gateway, routing(-1))  # warm-up: the first reload's allocations are not a leak
        run.before = _settled(client, timeout_s=10)[0]
        run.rss_before_kb = rss_kb(gateway)
        for i in range(RELOADS):
            _reload(gateway, routing(i))
            time.sleep(0.25)  # streams started on this router are in flight at the next reload
            names, subscribers, _ = _redis_view(client)
            run.during.append((subscribers, _index_owners(names)))
            sample()
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    run.after, run.released_s = _settled(client, timeout_s=10)
    run.rss_after_kb = rss_kb(gateway)
    _reload(gateway, routing(RELOADS))  # nothing in flight: the last router goes at once, nothing starts again
    run.idle = _redis_view(client)
    return run


def _reload(gateway: Gateway, routing: dict[str, Any]) -> None:
    data = {**gateway.data}
    data["pools"][MODEL]["routing"] = routing
    gateway.rewrite(data)
    answer = httpx.post(f"{gateway.url}/admin/reload", timeout=10)
    assert answer.status_code == 200, answer.text


@pytest.fixture
def redis_client() -> Iterator[tuple[RedisServer, redis.Redis]]:
    server = RedisServer().start()
    client = redis.Redis(port=server.port)
    try:
        yield server, client
    finally:
        client.close()
        server.stop()


def test_twenty_reloads_under_load_release_every_redis_client_and_subscription(
    tmp_path: Path, redis_client: tuple[RedisServer, redis.Redis]
) -> None:
    server, client = redis_client
    with running() as track:
        stubs = [track(start_stub(f"replica-{i}", speedup=40)) for i in range(2)]
        pools = {MODEL: {**pool(*((s.replica_id, s.url) for s in stubs)), "routing": {"policy": "prefix_affinity"}}}
        gateway = track(
            start_gateway(
                tmp_path, pools, redis={"url": server.url}, index={"store": "redis"}, logging={"requests": False}
            )
        )
        # 64 / 66 characters a block: a different routing section each time
        run = _reloads_under_load(
            gateway, client, lambda i: {"policy": "prefix_affinity", "prefix": {"block_chars": 64 + i % 2 * 2}}
        )
        run.report("reloads_redis")
        run.check()


def _event_sockets(gateway: Gateway, ports: set[int]) -> int:
    """The gateway's TCP connections to the replicas' KV-event publish and replay ports."""
    connections = psutil.Process(gateway.proc.popen.pid).net_connections(kind="tcp")
    return sum(1 for c in connections if c.raddr and c.raddr.port in ports and c.status == psutil.CONN_ESTABLISHED)


def test_twenty_reloads_under_load_release_the_kv_event_feeds(
    tmp_path: Path, redis_client: tuple[RedisServer, redis.Redis]
) -> None:
    """Each new router gets new feeds; the replaced feeds' sockets close with the reload."""
    server, client = redis_client
    with running() as track:
        replicas = [start_replica(f"replica-{i}") for i in range(2)]
        for replica in replicas:
            track(replica.stub)
        ports = {int(r.events.rsplit(":", 1)[1]) for r in replicas}

        def routing(i: int) -> dict[str, Any]:  # the tokenize budget alternates: a new section, the same keys
            return {
                "policy": "prefix_affinity",
                "prefix": {"tokenizer": "sim", "block_tokens": 16, "tokenize_budget_ms": 50 + i % 2},
            }

        pools = {
            MODEL: {
                "routing": routing(-2),
                "replicas": [
                    {
                        "url": r.stub.url,
                        "name": r.stub.replica_id,
                        "kv_events": {"endpoint": r.events, "replay_endpoint": r.replay},
                    }
                    for r in replicas
                ],
            }
        }
        gateway = track(
            start_gateway(
                tmp_path, pools, redis={"url": server.url}, index={"store": "redis"}, logging={"requests": False}
            )
        )
        feeds: list[int] = []
        process = psutil.Process(gateway.proc.popen.pid)
        threads_before = process.num_threads()
        run = _reloads_under_load(gateway, client, routing, sample=lambda: feeds.append(_event_sockets(gateway, ports)))
        run.report(
            "reloads_kv_events",
            most_feed_sockets=max(feeds),
            feed_sockets_idle=_event_sockets(gateway, ports),
            threads_before=threads_before,
            threads_after=process.num_threads(),
        )
        assert max(feeds) <= len(replicas), feeds  # one subscription per replica, the new router's
        run.check(MAX_RSS_GROWTH_KV_KB)
        eventually(lambda: _event_sockets(gateway, ports) == len(replicas), timeout_s=5)
