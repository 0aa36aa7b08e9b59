"""DNS discovery: a pool's replicas are the addresses a name resolves to (a Kubernetes headless Service).
A pool with `discovery.kubernetes` instead watches the API (`discovery.kubernetes`, imported only then).

Usage:
    discovery = Discovery(resolve_dns, apply)          # apply(model, [ReplicaConfig, ...], unready) updates the pool
    discovery.sync({"llama": pool_config.discovery})   # start, restart or stop one task per pool
    await discovery.close()

Each task resolves its name at start and then every `interval_s`, and hands the whole set to `apply`,
which adds new replicas and removes gone ones (and their warm-prefix tables). Resolution runs off
the event loop (`loop.getaddrinfo` uses the default executor). A name that does not exist or has no
records is an empty pool (scaled to zero); any other failure (timeout, server error) keeps the last
set, so a DNS hiccup never takes every replica out of rotation.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any

import structlog

from gateway.config.pools import DiscoveryConfig, ReplicaConfig
from gateway.replicas.discovery.discovered import Apply, discovered_replica

log = structlog.get_logger("gateway.replicas.discovery.dns")

Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
"""(name, port) -> addresses; raises `NameNotFound` when the name has no records."""

_NO_RECORDS = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


class NameNotFound(Exception):
    """The name exists nowhere or has no A/AAAA records: an authoritative empty answer."""


async def resolve_dns(name: str, port: int) -> list[str]:
    """A and AAAA records of `name` via the system resolver, in a worker thread."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in _NO_RECORDS:
            raise NameNotFound(name) from exc
        raise
    return sorted({str(info[4][0]) for info in infos})


def replica_configs(spec: DiscoveryConfig, addresses: Sequence[str]) -> list[ReplicaConfig]:
    """One replica per address, named `host:port` like a static replica without a name."""
    return [discovered_replica(spec, address, spec.port) for address in sorted(set(addresses))]


class Discovery:
    """One resolve (or watch) loop per pool that has `discovery`; `sync` follows config reloads."""

    def __init__(self, resolver: Resolver, apply: Apply) -> None:
        self._resolver, self._apply = resolver, apply
        self._tasks: dict[str, tuple[DiscoveryConfig, asyncio.Task[None]]] = {}
        self._first: dict[str, asyncio.Event] = {}

    def sync(self, specs: Mapping[str, DiscoveryConfig]) -> None:
        """Make the running loops match `specs` (model -> discovery); unchanged ones keep running."""
        for model, (spec, task) in list(self._tasks.items()):
            if specs.get(model) != spec:
                task.cancel()
                del self._tasks[model], self._first[model]
        for model, spec in specs.items():
            if model not in self._tasks:
                self._first[model] = asyncio.Event()
                task = asyncio.create_task(self._loop(model, spec), name=f"discovery-{model}")
                self._tasks[model] = (spec, task)

    async def resolved(self, timeout_s: float) -> None:
        """Wait (bounded) until every loop has tried once, so a starting gateway is ready at once."""
        try:
            await asyncio.wait_for(asyncio.gather(*(self._first[m].wait() for m in self._tasks)), timeout_s)
        except TimeoutError:
            log.warning("discovery_slow", detail=f"not every pool resolved within {timeout_s}s; continuing")

    async def close(self) -> None:
        tasks = [task for _, task in self._tasks.values()]
        self._tasks.clear()  # first: a loop that loses its cancel then ends by itself (_current)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _refresh(self, model: str, spec: DiscoveryConfig) -> None:
        """Resolve once and apply; on a resolver failure apply nothing (the last set stays)."""
        try:
            assert spec.dns is not None  # validated: a pool without `kubernetes` has `dns`
            addresses = await asyncio.wait_for(self._resolver(spec.dns, spec.port), timeout=max(1.0, spec.interval_s))
            replicas = replica_configs(spec, addresses)
        except NameNotFound:
            replicas = []
        except (TimeoutError, OSError, ValueError) as exc:
            log.warning("discovery_failed", model=model, dns=spec.dns, error=repr(exc))
            return
        if self._current(model):
            await self._apply(model, replicas, frozenset())

    def _current(self, model: str) -> bool:
        """This task is still `model`'s loop. A replaced loop checks for itself: on Python 3.11 the
        wait_for around a resolve can drop the cancel that replaced it (bpo-42130, gateway.support.cancel)."""
        entry = self._tasks.get(model)
        return entry is not None and entry[1] is asyncio.current_task()

    def _loop(self, model: str, spec: DiscoveryConfig) -> Coroutine[Any, Any, None]:
        if spec.kubernetes is None:
            return self._run(model, spec)
        from gateway.replicas.discovery.kubernetes import watch_slices  # the client library only where it is configured

        return watch_slices(model, spec, self._apply, self._first[model])

    async def _run(self, model: str, spec: DiscoveryConfig) -> None:
        while True:
            try:
                await self._refresh(model, spec)
            except Exception:  # noqa: BLE001 - a discovery bug must not stop discovery
                log.exception("discovery_error", model=model, dns=spec.dns)
            if not self._current(model):
                return
            self._first[model].set()
            await asyncio.sleep(spec.interval_s)
