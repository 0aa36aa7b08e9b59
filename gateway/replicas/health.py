"""Background monitor: active health probes, load scrapes and adapter lists (`/v1/models`) for
every replica of every pool. Under `serve --workers N` one worker's monitor asks the replicas and the
others take its findings (`gateway.replicas.shared_monitor`).

Both loops read the *current* config and pool list on each round, so a reload takes effect at the
next tick. Owned by the app's cleanup context (`start()` on startup, `stop()` on shutdown).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

import aiohttp
import structlog

from gateway.config.loader import Config
from gateway.replicas import load
from gateway.replicas.backend_auth import auth_headers
from gateway.replicas.models import list_models
from gateway.replicas.pool import ReplicaPool
from gateway.replicas.replica import Replica
from gateway.replicas.shared_monitor import Findings, Follower
from gateway.support.fd_limit import FdWatch

log = structlog.get_logger("gateway.health")


async def probe(
    session: aiohttp.ClientSession,
    replica: Replica,
    config: Config,
    on_ejected: Callable[[str], object] = lambda replica_id: None,
) -> bool:
    """One `GET /health`; 200 passes, anything else (or no answer in time) fails. A replica the probes
    turn unhealthy *because it stopped answering* (a probe timed out) is reported to `on_ejected`
    (the proxy cuts its attempts loose); one that answers non-200 or refuses new connections (a
    draining gateway: 503 /ready, then a closed listener) is alive: its open requests run on.
    Returns whether the probe timed out."""
    health = config.health
    was_available, was_healthy = replica.is_available(), replica.healthy
    try:
        async with session.get(replica.url + health.path, timeout=aiohttp.ClientTimeout(total=health.timeout_s)) as r:
            ok, error, silent = r.status == 200, f"health status {r.status}", False
    except (aiohttp.ClientError, TimeoutError) as exc:
        # Timed out: accepted, never answered (frozen). Refused or reset: a draining process still
        # ends its open requests.
        ok, error, silent = False, f"health probe: {type(exc).__name__}: {exc}", isinstance(exc, TimeoutError)
    replica.probe_result(ok, health, error)
    if was_healthy and not replica.healthy and silent:
        on_ejected(replica.replica_id)
    if replica.is_available() != was_available:
        log.warning(
            "replica_up" if replica.is_available() else "replica_down",
            replica=replica.replica_id,
            url=replica.url,
            error=None if ok else error,
        )
    return silent


class Monitor:
    """`follower`: this worker takes the owner's findings (`shared_monitor`); else it asks the replicas and
    keeps its `findings` for the followers."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        pools: Callable[[], Iterable[ReplicaPool]],
        config: Callable[[], Config],
        after_scrape: Callable[[], None] = lambda: None,
        on_ejected: Callable[[str], object] = lambda replica_id: None,
        follower: Follower | None = None,
    ) -> None:
        self._session, self._pools, self._config = session, pools, config
        self._on_ejected = on_ejected
        # after each round of scrapes or adapter lists: e.g. size the warm-prefix index from the KV-cache shape
        self._after_scrape = after_scrape
        self._tasks: list[asyncio.Task[None]] = []
        self.fds = FdWatch()  # the process's file descriptors, sampled once a probe round (not per request)
        self.findings = Findings()
        self._follower = follower

    async def _asked(self, part: str, interval_s: float) -> list[Replica]:
        """The replicas this worker asks itself: all of them, or those the owner has no fresh findings for."""
        if self._follower is None:
            return [replica for pool in self._pools() for replica in pool]
        return await self._follower.take(part, list(self._pools()), interval_s, self._on_ejected)

    async def probe_all(self) -> None:
        self.fds.check()
        config = self._config()
        replicas = await self._asked("health", config.health.interval_s)
        silent = await asyncio.gather(*(probe(self._session, r, config, self._on_ejected) for r in replicas))
        for replica, timed_out in zip(replicas, silent):
            self.findings.probed(replica, timed_out)

    async def scrape_all(self) -> None:
        cfg = self._config().load
        if not cfg.enabled:
            return
        replicas = await self._asked("load", cfg.interval_s)
        await asyncio.gather(*(load.scrape(self._session, r, cfg.path, cfg.timeout_s) for r in replicas))
        self.findings.done("load", replicas)
        self._after_scrape()

    async def list_all(self) -> None:
        """Each available replica's model card and LoRA adapters (a replica that is down keeps its last)."""
        config = self._config()
        asked = {id(r) for r in await self._asked("models", config.health.interval_s)}
        listed = [(pool, r) for pool in self._pools() for r in pool if id(r) in asked and r.is_available()]
        await asyncio.gather(
            *(
                list_models(
                    self._session,
                    r,
                    pool.model,
                    auth_headers(config.backend_key(pool.model, r.replica_id)),
                    config.health.timeout_s,
                )
                for pool, r in listed
            )
        )
        self.findings.done("models", [r for _, r in listed])
        self._after_scrape()

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._every(self.probe_all, lambda c: c.health.interval_s)),
            asyncio.create_task(self._every(self.scrape_all, lambda c: c.load.interval_s)),
            asyncio.create_task(self._every(self.list_all, lambda c: c.health.interval_s)),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def _every(self, step: Callable[[], Awaitable[None]], interval: Callable[[Config], float]) -> None:
        while True:
            try:
                await step()
            except Exception:  # noqa: BLE001 - a monitor bug must not stop monitoring
                log.exception("monitor_error")
            await asyncio.sleep(interval(self._config()))
