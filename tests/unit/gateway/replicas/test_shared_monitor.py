"""A follower takes the owner's fresh findings and asks the replicas itself for everything else."""

from __future__ import annotations

import time

import orjson
import pytest

from gateway.replicas import ReplicaPool
from gateway.replicas.replica import Replica, ReplicaLoad
from gateway.replicas.shared_monitor import FRESH_S, STALE_MIN_S, Findings, Follower

pytestmark = pytest.mark.timeout(10)


def pools() -> list[ReplicaPool]:
    return [ReplicaPool("m", [Replica("r0", "http://r0"), Replica("r1", "http://r1")])]


def owner_findings() -> tuple[list[ReplicaPool], Findings]:
    mine = pools()
    r0, r1 = mine[0]
    r0.healthy, r0.probe_failures, r0.last_error = False, 3, "health probe: TimeoutError"
    r0.load = ReplicaLoad(running=4, waiting=2, kv_usage=0.5, num_gpu_blocks=64, block_size=16, scraped_at=1.0)
    r0.model_card, r0.adapters = {"max_model_len": 4096}, {"lora-a": "/a"}
    findings = Findings()
    findings.probed(r0, silent=True)
    findings.probed(r1, silent=False)
    findings.done("load", [r0, r1])
    findings.done("models", [r0])
    return mine, findings


async def test_a_follower_takes_each_part_and_asks_for_what_it_has_no_findings_of() -> None:
    owner, findings = owner_findings()
    body = findings.snapshot(owner)
    follower, ejected = Follower(lambda: _returns(body)), []
    mine = pools()
    assert await follower.take("health", mine, 2.0, ejected.append) == []
    assert await follower.take("load", mine, 0.5, ejected.append) == []
    r0, r1 = mine[0]
    assert await follower.take("models", mine, 2.0, ejected.append) == [r1], "r1 was never listed by the owner"
    assert (r0.healthy, r0.probe_failures, r0.last_error) == (False, 3, "health probe: TimeoutError")
    assert r0.load == owner[0].get("r0").load and r0.model_card == {"max_model_len": 4096}  # type: ignore[union-attr]
    assert r0.adapters == {"lora-a": "/a"} and r1.healthy
    assert ejected == ["r0"], "a replica that stopped answering cuts this worker's attempts there too"


async def test_no_owner_stale_findings_or_another_address_mean_asking_the_replicas() -> None:
    owner, findings = owner_findings()
    away = Follower(lambda: _returns(None))
    assert len(await away.take("health", pools(), 2.0, print)) == 2
    garbled = Follower(lambda: _returns(b"not json"))
    assert len(await garbled.take("health", pools(), 2.0, print)) == 2
    findings.at["load"] = {url: time.monotonic() - 10 for url in findings.at["load"]}  # 10 s old, interval 0.5 s
    stale = Follower(lambda: _returns(findings.snapshot(owner)))
    assert len(await stale.take("load", pools(), 0.5, print)) == 2
    moved = pools()
    moved[0].get("r0").url = "http://elsewhere"  # type: ignore[union-attr]
    follower = Follower(lambda: _returns(findings.snapshot(owner)))
    assert [r.replica_id for r in await follower.take("health", moved, 2.0, print)] == ["r0"]


async def test_findings_of_a_short_interval_stay_fresh_for_a_second() -> None:
    """A busy owner's loop lags a 0.1 s interval by a few of them: its followers must not start probing."""
    owner, findings = owner_findings()
    findings.at["load"] = {url: time.monotonic() - 0.6 for url in findings.at["load"]}  # 6 intervals of 0.1 s
    lagging = Follower(lambda: _returns(findings.snapshot(owner)))
    assert await lagging.take("load", pools(), 0.1, print) == []
    findings.at["load"] = {url: time.monotonic() - (STALE_MIN_S + 0.2) for url in findings.at["load"]}
    away = Follower(lambda: _returns(findings.snapshot(owner)))
    assert len(await away.take("load", pools(), 0.1, print)) == 2


async def test_the_owner_is_read_once_per_fresh_window() -> None:
    reads: list[int] = []

    async def fetch() -> bytes:
        reads.append(1)
        return orjson.dumps({})

    follower = Follower(fetch)
    for part in ("health", "load", "models"):
        await follower.take(part, pools(), 2.0, print)
    assert len(reads) == 1
    time.sleep(FRESH_S)
    await follower.take("load", pools(), 2.0, print)
    assert len(reads) == 2


async def _returns(body: bytes | None) -> bytes | None:
    return body
