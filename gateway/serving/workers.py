"""`affinity-gateway serve --workers N`: one supervisor, N full gateway processes on one port.

One event loop saturates one core; the workers are N copies of `serve`, each with its own loop,
bound to the same port with SO_REUSEPORT, so the kernel spreads new connections over them. The
supervisor only starts, watches and stops them:

- a worker that exits on its own (crash, SIGKILL, OOM) is started again after an exponential
  backoff (`SupervisorPolicy`); `crash_limit` exits within `crash_window_s` (a config that cannot
  start, a port held by another program) make the supervisor stop the rest and exit 1, with one
  `workers_crash_loop` error event, instead of restarting forever;
- SIGTERM/SIGINT go to every worker, which drains as a single gateway does (`gateway.serving.lifecycle`);
  the supervisor exits once they have, or SIGKILLs what is left after the drain time plus a margin;
  SIGHUP goes to every worker too (each reloads its config);
- workers get SIGTERM from the kernel if the supervisor itself dies (PR_SET_PDEATHSIG).

Each worker keeps its own state (warm-prefix tables unless Redis or KV events share them, breakers,
admission counts; docs/SCALING.md says what that costs), but for one monitor: worker 0 probes, scrapes
and lists the replicas and the others take its findings (`gateway.replicas.shared_monitor`), so the
replicas see one gateway's background traffic whatever N; likewise worker 0 alone subscribes to the
replicas' KV events and forwards them to the others (`gateway.index.kv_events.relay`). Its /metrics are its own too, so
`GET /metrics` on the public port, answered by whichever worker the kernel picked, scrapes the other
workers over their private Unix sockets (abstract names `@affinity-gateway-<supervisor pid>-worker-<i>`:
no file, so a read-only root file system is fine; the same app on a second site)
and returns every worker's series with a `worker` label, plus `affinity_gateway_worker_up`. Scraping
siblings keeps the metrics code as it is (custom collectors read live pool state at scrape time,
which prometheus_client's multiprocess mode cannot carry) and keeps a restarted worker's counters
apart (a reset Prometheus sees per series) instead of summing dead processes' files.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from gateway.index.kv_events.relay import Sharing
from gateway.observability.metrics import CONTENT_TYPE
from gateway.replicas import shared_monitor
from gateway.replicas.shared_monitor import Follower
from gateway.serving.app_keys import FOLLOWER, MONITOR, ROUTE_TABLE
from gateway.serving.lifecycle import CUT_S
from gateway.support.backoff import doubled_s

log = structlog.get_logger("gateway.serving.workers")
WORKER_LABEL = "worker"
SCRAPE_TIMEOUT_S = 2.0  # a sibling that does not answer in time is reported down in this scrape
STOP_MARGIN_S = 5.0  # past the drain time: background tasks' own stop, then SIGKILL
_PR_SET_PDEATHSIG = 1
OWNER = 0  # the worker whose monitor asks the replicas; the others take its findings


@dataclass(frozen=True)
class SupervisorPolicy:
    """When a worker is restarted, and when restarting is given up."""

    crash_limit: int = 5  # this many worker exits ...
    crash_window_s: float = 30.0  # ... within this window: the supervisor exits 1
    backoff_s: float = 0.5  # first restart delay, doubled for each recent exit of the same worker
    backoff_max_s: float = 10.0

    def delay(self, recent_exits: int) -> float:
        return doubled_s(self.backoff_s, max(recent_exits - 1, 0), self.backoff_max_s)


@dataclass(frozen=True)
class WorkerSpec:
    """Who a worker is: its index (the `worker` label, stable across restarts), how many there are,
    and its supervisor's group name, which names every worker's private socket."""

    index: int
    count: int
    group: str

    def socket(self, index: int | None = None) -> str:
        """An abstract Unix socket name (Linux): nothing on disk, gone with the process."""
        return f"\0{self.group}-worker-{self.index if index is None else index}"


# --- the supervisor -------------------------------------------------------------------------------------


def supervise(config_path: str, workers: int, drain_s: float, policy: SupervisorPolicy | None = None) -> int:
    """Run `workers` gateway processes on `config_path` until SIGTERM/SIGINT (0) or a crash loop (1)."""
    group = f"affinity-gateway-{os.getpid()}"
    return asyncio.run(_Supervisor(config_path, workers, drain_s, policy or SupervisorPolicy(), group).run())


class _Supervisor:
    def __init__(self, config_path: str, workers: int, drain_s: float, policy: SupervisorPolicy, group: str) -> None:
        self.config_path, self.workers, self.drain_s, self.policy = config_path, workers, drain_s, policy
        self.group = group
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.exits: deque[float] = deque()  # every worker's unplanned exits, newest last
        self.stop = asyncio.Event()
        self.crash_loop = asyncio.Event()
        self.stop_signal = signal.SIGTERM

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_stop, sig)
        loop.add_signal_handler(signal.SIGHUP, self._forward, signal.SIGHUP)
        log.info("workers_starting", workers=self.workers, supervisor_pid=os.getpid())
        keepers = [asyncio.create_task(self._keep(i)) for i in range(self.workers)]
        waits: list[asyncio.Task[Any]] = [
            asyncio.create_task(self.stop.wait()),
            asyncio.create_task(self.crash_loop.wait()),
        ]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in waits:
            task.cancel()
        self.stop.set()  # keepers start nothing more
        self._forward(self.stop_signal)
        await self._reap(self.drain_s + STOP_MARGIN_S)
        for task in keepers:
            task.cancel()
        await asyncio.gather(*keepers, return_exceptions=True)
        if self.crash_loop.is_set():
            return 1
        log.info("workers_stopped", workers=self.workers)
        return 0

    def _on_stop(self, sig: int) -> None:
        if not self.stop.is_set():
            log.info("workers_draining", signal=signal.Signals(sig).name, drain_s=self.drain_s)
        self.stop_signal = signal.Signals(sig)
        self.stop.set()

    def _forward(self, sig: int) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.send_signal(sig)

    async def _reap(self, timeout_s: float) -> None:
        """Wait for every worker to exit; SIGKILL whichever is still there after `timeout_s`."""
        live = [proc for proc in self.procs.values() if proc.returncode is None]
        _, pending = (
            await asyncio.wait([asyncio.create_task(p.wait()) for p in live], timeout=timeout_s)
            if live
            else (set(), set())
        )
        if pending:
            log.warning("workers_killed", workers=[i for i, p in self.procs.items() if p.returncode is None])
            self._forward(signal.SIGKILL)
            await asyncio.gather(*pending)

    async def _keep(self, index: int) -> None:
        """Start worker `index`, and again after each unplanned exit, until stop or a crash loop."""
        mine: deque[float] = deque()  # this worker's recent exits, for its backoff
        while not self.stop.is_set():
            started = time.monotonic()
            proc = await asyncio.create_subprocess_exec(*self._command(index), preexec_fn=_die_with_parent)
            self.procs[index] = proc
            log.info("worker_started", worker=index, pid=proc.pid)
            if self.stop.is_set():  # the stop came while it was being spawned
                proc.send_signal(self.stop_signal)
            code = await proc.wait()
            if self.stop.is_set():
                log.info("worker_exited", worker=index, pid=proc.pid, code=code)
                return
            now = time.monotonic()
            for exits in (self.exits, mine):
                exits.append(now)
                while exits and now - exits[0] > self.policy.crash_window_s:
                    exits.popleft()
            if len(self.exits) >= self.policy.crash_limit:
                log.error(
                    "workers_crash_loop",
                    worker=index,
                    code=code,
                    exits=len(self.exits),
                    window_s=self.policy.crash_window_s,
                    hint="workers keep exiting; see their logs above (config, port, permissions)",
                )
                self.crash_loop.set()
                return
            delay = self.policy.delay(len(mine))
            log.warning(
                "worker_restarting", worker=index, pid=proc.pid, code=code, ran_s=round(now - started, 3), delay_s=delay
            )
            try:
                await asyncio.wait_for(self.stop.wait(), delay)
            except TimeoutError:
                pass

    def _command(self, index: int) -> list[str]:
        """The same CLI, one worker; host, port, workers and log level reach it through the env."""
        return [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--config",
            self.config_path,
            "--worker-index",
            str(index),
            "--worker-group",
            self.group,
        ]


def _die_with_parent() -> None:
    """In the forked child: SIGTERM (a graceful drain) when the supervisor dies, even by SIGKILL."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


# --- in each worker: /metrics of all workers ------------------------------------------------------------


def attach(app: web.Application, spec: WorkerSpec) -> web.Application:
    """Make this worker's public `GET /metrics` answer for all workers, and share one monitor: worker 0
    answers its findings on its private socket, the others take them (`gateway.replicas.shared_monitor`);
    and one KV-event subscription per replica: worker 0's, relayed to the others. Before the app starts."""
    app.middlewares.append(_merged_metrics(spec))
    if spec.count > 1:
        app[ROUTE_TABLE].kv_feeds.sharing = Sharing(spec.group, owner=spec.index == OWNER)
    if spec.index == OWNER:
        app.router.add_get(shared_monitor.PATH, _findings)
    else:
        app[FOLLOWER] = Follower(partial(_get, spec.socket(OWNER), shared_monitor.PATH, {}))
    return app


async def _findings(request: web.Request) -> web.Response:
    """The owner's monitor findings, to a sibling on the private socket; the public port has no such route."""
    if not _private(request):
        raise web.HTTPNotFound()
    app = request.app
    return web.Response(body=app[MONITOR].findings.snapshot(app[ROUTE_TABLE].pools()), content_type="application/json")


def _merged_metrics(spec: WorkerSpec) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def merged_metrics(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        response = await handler(request)
        if (
            request.path != "/metrics"
            or _private(request)
            or response.status != 200
            or not isinstance(response, web.Response)
            or not isinstance(response.body, bytes)
        ):
            return response
        headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        others = [i for i in range(spec.count) if i != spec.index]
        scrapes = (_get(spec.socket(i), "/metrics", headers) for i in others)
        bodies = dict(zip(others, await asyncio.gather(*scrapes)))
        bodies[spec.index] = response.body
        return web.Response(body=merge(bodies), headers={"Content-Type": CONTENT_TYPE})

    return merged_metrics


def _private(request: web.Request) -> bool:
    """Came in on this worker's Unix socket: a sibling's scrape, answered with this worker's own."""
    transport = request.transport
    return transport is not None and isinstance(transport.get_extra_info("sockname"), (str, bytes))


async def _get(path: str, target: str, headers: Mapping[str, str]) -> bytes | None:
    """A sibling's answer to `GET target` (its own /metrics, worker 0's monitor findings), or None when it is
    down, restarting or slow. One HTTP/1.0 GET on a
    socket connected here: uvloop's create_unix_connection (aiohttp's UnixConnector) refuses abstract
    names with EINVAL, its sock_connect does not; the sibling's aiohttp answers and closes."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    try:
        async with asyncio.timeout(SCRAPE_TIMEOUT_S):
            await loop.sock_connect(sock, path)
            reader, writer = await asyncio.open_unix_connection(sock=sock)
            try:
                writer.write(f"GET {target} HTTP/1.0\r\nHost: worker\r\n{head}\r\n".encode("latin-1"))
                answer = await reader.read()
            finally:
                writer.close()
    except (OSError, TimeoutError):
        sock.close()
        return None
    status, _, rest = answer.partition(b"\r\n")
    _, _, body = rest.partition(b"\r\n\r\n")
    return body if status.split(b" ")[1:2] == [b"200"] else None


def merge(bodies: Mapping[int, bytes | None]) -> bytes:
    """Prometheus text of several workers as one exposition: each family once, every sample with
    its worker's label; `affinity_gateway_worker_up` says which workers answered."""
    families: dict[str, Metric] = {}
    up = GaugeMetricFamily(
        "affinity_gateway_worker_up", "1 when the worker answered this merged scrape", labels=[WORKER_LABEL]
    )
    for index, body in sorted(bodies.items()):
        up.add_metric([str(index)], float(body is not None))
        for family in text_string_to_metric_families(body.decode()) if body is not None else ():
            merged = families.setdefault(
                family.name, Metric(family.name, family.documentation, family.type, family.unit)
            )
            merged.samples.extend(s._replace(labels={WORKER_LABEL: str(index), **s.labels}) for s in family.samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([up, *families.values()]))
    return generate_latest(registry)


class _Families:
    """A collector that yields families already built."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


def drain_time_s(ready_delay_s: float, grace_s: float) -> float:
    """How long a worker may take to drain after SIGTERM (gateway.serving.lifecycle's bound)."""
    return ready_delay_s + grace_s + CUT_S
