"""DNS discovery: config rules, address → replica mapping, and the pool following a resolver we control."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gateway.config.loader import load_config, parse_config
from gateway.config.pools import DiscoveryConfig, ReplicaConfig
from gateway.errors import ConfigError
from gateway.index import MemoryIndex
from gateway.observability.routing_metrics import RoutingMetrics
from gateway.replicas.discovery.dns import Discovery, NameNotFound, replica_configs, resolve_dns
from gateway.routing.route_table import RouteTable


class FakeDNS:
    """A resolver the test edits: name -> addresses; a missing name has no records; `down` raises."""

    def __init__(self, **records: list[str]) -> None:
        self.records = {name.replace("_", "-"): list(a) for name, a in records.items()}
        self.down = False
        self.calls = 0

    async def resolve(self, name: str, port: int) -> list[str]:
        self.calls += 1
        if self.down:
            raise OSError("DNS server timed out")
        if name not in self.records:
            raise NameNotFound(name)
        return self.records[name]


def data(*, static: tuple[str, ...] = (), dns: str | None = "replicas", policy: str = "round_robin") -> dict[str, Any]:
    pool: dict[str, Any] = {"routing": {"policy": policy}}
    if static:
        pool["replicas"] = [{"url": f"http://{h}:1", "name": h} for h in static]
    if dns is not None:
        pool["discovery"] = {"dns": dns, "port": 8000, "interval_s": 0.02}
    return {"pools": {"m": pool}}


async def started(tmp_path: Path, config: dict[str, Any], dns: FakeDNS) -> tuple[RouteTable, Path]:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(config))
    state = RouteTable(load_config(path), path, RoutingMetrics(CollectorRegistry()))
    state.resolver = dns.resolve
    await state.start()
    return state, path


def ids(state: RouteTable) -> list[str]:
    return sorted(r.replica_id for r in state.routes["m"].pool)


async def until(check: Callable[[], bool], timeout: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_a_pool_may_be_discovery_only_but_needs_something() -> None:
    config = parse_config(data())
    assert config.pools["m"].replicas == () and config.pools["m"].discovery == DiscoveryConfig(
        dns="replicas", port=8000, interval_s=0.02
    )
    with pytest.raises(ConfigError, match=r"pools\.m\.replicas: a pool needs at least one replica \(or `discovery`\)"):
        parse_config(data(dns=None))


@pytest.mark.parametrize(("key", "value"), [("dns", "http://x"), ("port", 0), ("interval_s", 0), ("scheme", "ftp")])
def test_bad_discovery_values_name_their_key(key: str, value: Any) -> None:
    config = data()
    config["pools"]["m"]["discovery"][key] = value
    with pytest.raises(ConfigError, match=rf"pools\.m\.discovery\.{key}"):
        parse_config(config)


def test_addresses_become_host_port_replicas() -> None:
    spec = DiscoveryConfig(dns="r", port=9000, scheme="https", weight=2.0)
    replicas = replica_configs(spec, ["10.0.0.2", "fd00::1", "10.0.0.2"])
    assert [(r.url, r.replica_id, r.weight) for r in replicas] == [
        ("https://10.0.0.2:9000", "10.0.0.2:9000", 2.0),
        ("https://[fd00::1]:9000", "[fd00::1]:9000", 2.0),
    ]


async def test_system_resolver_reads_a_records_off_the_loop() -> None:
    assert "127.0.0.1" in await resolve_dns("localhost", 80)


async def test_replicas_appear_and_disappear_with_the_records(tmp_path: Path) -> None:
    dns = FakeDNS(replicas=["10.0.0.1", "10.0.0.2"])
    state, _ = await started(tmp_path, data(policy="prefix_affinity"), dns)
    try:
        assert ids(state) == ["10.0.0.1:8000", "10.0.0.2:8000"]  # resolved before start() returns
        index = state.routes["m"].router.index
        assert isinstance(index, MemoryIndex)
        index.record("10.0.0.2:8000", [1, 2, 3])
        kept = state.routes["m"].pool.get("10.0.0.1:8000")
        assert kept is not None
        kept.in_flight = 3
        dns.records["replicas"] = ["10.0.0.1", "10.0.0.3"]
        await until(lambda: ids(state) == ["10.0.0.1:8000", "10.0.0.3:8000"])
        assert state.routes["m"].pool.get("10.0.0.1:8000") is kept and kept.in_flight == 3
        assert index.size("10.0.0.2:8000") == 0  # a removed replica's warm prefixes are forgotten
        del dns.records["replicas"]  # scaled to zero: the name has no records
        await until(lambda: ids(state) == [])
    finally:
        await state.close()


async def test_a_failing_resolver_keeps_the_last_set(tmp_path: Path) -> None:
    dns = FakeDNS(replicas=["10.0.0.1"])
    state, _ = await started(tmp_path, data(static=("static-a",)), dns)
    try:
        assert ids(state) == ["10.0.0.1:8000", "static-a"]
        dns.down = True
        calls = dns.calls
        await until(lambda: dns.calls >= calls + 3)
        assert ids(state) == ["10.0.0.1:8000", "static-a"]
        dns.down = False
        dns.records["replicas"] = []
        await until(lambda: ids(state) == ["static-a"])
    finally:
        await state.close()


async def test_reload_keeps_discovered_replicas_and_follows_the_discovery_section(tmp_path: Path) -> None:
    dns = FakeDNS(replicas=["10.0.0.1"], other=["10.0.9.9"])
    state, path = await started(tmp_path, data(), dns)
    try:
        path.write_text(yaml.safe_dump(data(static=("static-a",))))
        await state.reload()
        assert ids(state) == ["10.0.0.1:8000", "static-a"]
        path.write_text(yaml.safe_dump(data(static=("static-a",), dns="other")))
        await state.reload()
        await until(lambda: ids(state) == ["10.0.9.9:8000", "static-a"])
        path.write_text(yaml.safe_dump(data(static=("static-a",), dns=None)))
        await state.reload()
        assert ids(state) == ["static-a"]
        await asyncio.sleep(0.1)  # the stopped loop adds nothing back
        assert ids(state) == ["static-a"]
    finally:
        await state.close()


async def test_a_loop_a_reload_replaces_ends_even_if_it_loses_a_cancel() -> None:
    """On Python 3.11 wait_for (around each resolve) can drop a cancel that lands as the resolve
    completes: the replaced loop must end anyway, not go on resolving the old name beside the new."""
    applied: list[str] = []
    dns = FakeDNS(old=["10.0.0.1"], new=["10.0.0.2"])

    async def apply(model: str, found: list[ReplicaConfig], unready: frozenset[str]) -> None:
        applied.append(found[0].url)
        if len(applied) == 1:
            with contextlib.suppress(asyncio.CancelledError):  # the lost cancel
                await asyncio.sleep(10)

    discovery = Discovery(dns.resolve, apply)
    discovery.sync({"m": DiscoveryConfig(dns="old", interval_s=0.01)})
    await until(lambda: len(applied) == 1)
    discovery.sync({"m": DiscoveryConfig(dns="new", interval_s=0.01)})  # a reload changed the section
    await until(lambda: len(applied) >= 10)
    await discovery.close()
    assert applied[1:] == ["http://10.0.0.2:8000"] * (len(applied) - 1)
