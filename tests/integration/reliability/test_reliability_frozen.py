"""A frozen replica (SIGSTOP on a real stub process) is cut loose: by its health probes ejecting it, or
by the silence limits (`timeouts.first_byte_s`, `timeouts.idle_s`) when no probe notices."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.gateway_procs import MODEL, Stub, pool, running, start_gateway, start_stub
from tests.integration.reliability_tools import Load, chat, report, streaming

pytestmark = pytest.mark.timeout(90)
STREAMS = 10


async def _frozen_scenario(gateway_url: str, frozen: Stub) -> tuple[Load, Load, float, float]:
    """STREAMS streams running on both replicas, then SIGSTOP one, then 6 whole requests sent at once:
    returns (streams, later requests, seconds the cut streams took to end, seconds the later took)."""
    streams, later = Load(gateway_url, timeout_s=30), Load(gateway_url, timeout_s=30)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = await streaming(streams, session, STREAMS, max_tokens=2000)
        assert frozen.proc is not None
        frozen.proc.popen.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        late = await asyncio.gather(*(later.one(session, chat(f"later {i}", max_tokens=4)) for i in range(6)))
        later_s = time.monotonic() - stopped
        cut = [t for t, o in zip(tasks, streams.outcomes) if o.replica == frozen.replica_id]
        await asyncio.gather(*cut)
        cut_s = time.monotonic() - stopped
        for task in tasks:
            task.cancel()  # the healthy replica's long streams are not this test's subject
        await asyncio.gather(*tasks, return_exceptions=True)
    assert len(late) == 6
    return streams, later, cut_s, later_s


def _check(
    name: str, streams: Load, later: Load, frozen: Stub, cut_s: float, later_s: float, limit_s: float, **extra: Any
) -> None:
    on_frozen = [o for o in streams.outcomes if o.replica == frozen.replica_id]
    report(
        name,
        later.outcomes + on_frozen,
        cut_streams=len(on_frozen),
        cut_in_s=round(cut_s, 2),
        later_served_in_s=round(later_s, 2),
        **extra,
    )
    assert on_frozen and all(o.stream_error_event for o in on_frozen), [o.body[-200:] for o in on_frozen]
    assert all(o.clean and o.replica != frozen.replica_id for o in later.outcomes), later.outcomes
    assert cut_s < limit_s and later_s < limit_s, (cut_s, later_s)


def _freeze_one_of_two(
    tmp_path: Path, name: str, limit_s: float, health: dict[str, float], timeouts: dict[str, float]
) -> None:
    with running() as track:
        frozen, ok = track(start_stub("frozen", speedup=1)), track(start_stub("ok", speedup=1))
        gateway = track(
            start_gateway(
                tmp_path,
                {MODEL: pool(("frozen", frozen.url), ("ok", ok.url))},
                health=health,
                timeouts={"connect_s": 1.0, **timeouts},
            )
        )
        try:
            streams, later, cut_s, later_s = asyncio.run(_frozen_scenario(gateway.url, frozen))
        finally:
            assert frozen.proc is not None
            frozen.proc.popen.send_signal(signal.SIGCONT)
        _check(name, streams, later, frozen, cut_s, later_s, limit_s, **timeouts)


def test_ejected_replica_is_cut_loose(tmp_path: Path) -> None:
    """Probes eject the frozen replica: its open streams get the error event, and requests waiting for
    its first byte move to the other replica, within the probe interval plus the retry."""
    _freeze_one_of_two(
        tmp_path,
        "frozen replica ejected by probes",
        3.0,
        {"interval_s": 0.2, "timeout_s": 0.3, "unhealthy_after": 2, "healthy_after": 1},
        {"first_byte_s": 60.0, "idle_s": 60.0},
    )


def test_silent_replica_is_cut_by_first_byte_and_idle_limits(tmp_path: Path) -> None:
    """No probe notices (one a minute): the idle limit ends its streams, the first-byte limit moves new
    requests elsewhere (nothing reached their clients yet)."""
    _freeze_one_of_two(
        tmp_path,
        "frozen replica, silence limits",
        4.0,
        {"interval_s": 60.0, "timeout_s": 1.0},
        {"first_byte_s": 1.5, "idle_s": 1.0},
    )
