"""One monitor for every worker of `serve --workers N`: worker 0 probes, scrapes and lists the replicas as a
single gateway does, and the other workers take what it found instead of asking the replicas themselves.

Why: every worker is a whole gateway, and with a monitor each, N workers sent every replica N times the
health probes, load scrapes and model lists (`python -m bench.hop.background`). Now a follower reads the
owner's findings (`snapshot`) from its private socket, at most once per `FRESH_S` whichever of its loops
asks, and applies them (`apply`); the replicas see one gateway's background traffic.

What a follower takes: each replica's probe state (healthy, its pass and failure counts, the last error,
and whether the owner's last failing probe timed out, which cuts the follower's own attempts there too),
the last load scrape and the model card and adapters. Its breakers stay its own: they count the faults of
its own requests. A replica the snapshot does not name (the owner has not probed it yet: it was just added,
or discovered by this worker first), or whose findings are older than three of their intervals and at
least a second, and every replica while the owner does not answer (restarting), is asked directly, as
before, so a follower never goes blind.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson

from gateway.replicas.pool import ReplicaPool
from gateway.replicas.replica import Replica, ReplicaLoad

PATH = "/internal/monitor"  # the owner answers it on its private socket only (gateway.serving.workers)
FRESH_S = 0.25  # a follower's loops share one read of the owner's findings within this long
STALE_INTERVALS = 3  # findings older than this many of their intervals (and STALE_MIN_S) are not taken
STALE_MIN_S = 1.0  # a busy owner's loop may lag a short interval by a few of them: not yet away
Part = str  # "health", "load" or "models"


class Findings:
    """What the owner's monitor found, per replica: kept by the owner's `Monitor` as it probes."""

    def __init__(self) -> None:
        self.silent: dict[str, bool] = {}  # replica url -> its last failing probe timed out
        self.at: dict[Part, dict[str, float]] = {"health": {}, "load": {}, "models": {}}  # part -> url -> when

    def probed(self, replica: Replica, silent: bool) -> None:
        self.silent[replica.url] = silent
        self.at["health"][replica.url] = time.monotonic()

    def done(self, part: Part, replicas: Iterable[Replica]) -> None:
        now = time.monotonic()
        for replica in replicas:
            self.at[part][replica.url] = now

    def snapshot(self, pools: Iterable[ReplicaPool]) -> bytes:
        """Every replica's findings, by pool and replica id (monotonic clocks are the machine's, so the
        times read the same in every worker)."""
        out: dict[str, dict[str, Any]] = {}
        for pool in pools:
            out[pool.model] = {
                r.replica_id: {
                    "url": r.url,
                    "at": {part: when.get(r.url) for part, when in self.at.items()},
                    "healthy": r.healthy,
                    "probe_passes": r.probe_passes,
                    "probe_failures": r.probe_failures,
                    "last_error": r.last_error,
                    "silent": self.silent.get(r.url, False),
                    "load": dataclasses.asdict(r.load),
                    "model_card": r.model_card,
                    "adapters": r.adapters,
                }
                for r in pool
            }
        return orjson.dumps(out)


class Follower:
    """A worker's view of the owner's findings: read at most once per `FRESH_S`, None while it is away."""

    def __init__(self, fetch: Callable[[], Awaitable[bytes | None]]) -> None:
        self._fetch = fetch
        self._read_at = -FRESH_S
        self._found: dict[str, Any] | None = None

    async def findings(self) -> dict[str, Any] | None:
        now = time.monotonic()
        if now - self._read_at >= FRESH_S:
            self._read_at = now
            body = await self._fetch()
            try:
                found = orjson.loads(body) if body is not None else None
            except orjson.JSONDecodeError:
                found = None
            self._found = found if isinstance(found, dict) else None
        return self._found

    async def take(
        self, part: Part, pools: Iterable[ReplicaPool], interval_s: float, on_ejected: Callable[[str], object]
    ) -> list[Replica]:
        """Apply the owner's fresh findings of `part` to this worker's replicas; the ones it has none for
        (the caller asks those itself)."""
        found = await self.findings()
        rest: list[Replica] = []
        now = time.monotonic()
        for pool in pools:
            mine = found.get(pool.model) if found is not None else None
            for replica in pool:
                entry = mine.get(replica.replica_id) if isinstance(mine, dict) else None
                if not (
                    isinstance(entry, dict)
                    and _fresh(entry, replica, part, now, interval_s)
                    and apply(part, replica, entry, on_ejected)
                ):
                    rest.append(replica)
        return rest


def _fresh(entry: dict[str, Any], replica: Replica, part: Part, now: float, interval_s: float) -> bool:
    """Findings of the same replica (by URL: a reload may give an id a new address), not yet stale."""
    at = entry.get("at")
    when = at.get(part) if isinstance(at, dict) else None
    return (
        entry.get("url") == replica.url
        and isinstance(when, (int, float))
        and now - when <= max(STALE_INTERVALS * interval_s, STALE_MIN_S)
    )


def apply(part: Part, replica: Replica, entry: dict[str, Any], on_ejected: Callable[[str], object]) -> bool:
    """Take one part of the owner's findings for `replica`; False when they do not read as expected."""
    try:
        if part == "health":
            was_healthy = replica.healthy
            replica.healthy = bool(entry["healthy"])
            replica.probe_passes, replica.probe_failures = int(entry["probe_passes"]), int(entry["probe_failures"])
            replica.last_error = str(entry["last_error"])
            if was_healthy and not replica.healthy and entry["silent"]:
                on_ejected(replica.replica_id)  # it stopped answering: this worker's attempts there are cut too
        elif part == "load":
            replica.load = ReplicaLoad(**entry["load"])
        else:
            replica.model_card, replica.adapters = dict(entry["model_card"]), dict(entry["adapters"])
    except (KeyError, TypeError, ValueError):
        return False
    return True
