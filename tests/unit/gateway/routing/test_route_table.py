"""Reload semantics: routers kept or rebuilt, pools keep replica state, bad files change nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gateway.config.loader import load_config
from gateway.errors import ConfigError, NotFoundError
from gateway.index import MemoryIndex
from gateway.observability.routing_metrics import RoutingMetrics
from gateway.routing.route_table import RouteTable


def config_data(policy: str = "round_robin", replicas: tuple[str, ...] = ("a", "b")) -> dict[str, Any]:
    return {
        "pools": {
            "m": {"replicas": [{"url": f"http://{r}:1", "name": r} for r in replicas], "routing": {"policy": policy}}
        }
    }


async def started(tmp_path: Path, data: dict[str, Any]) -> tuple[RouteTable, Path]:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(data))
    state = RouteTable(load_config(path), path, RoutingMetrics(CollectorRegistry()))
    await state.start()
    return state, path


async def test_reload_keeps_router_and_replica_state_when_routing_unchanged(tmp_path: Path) -> None:
    state, path = await started(tmp_path, config_data())
    router, replica = state.routes["m"].router, state.routes["m"].pool.get("a")
    assert replica is not None
    replica.in_flight = 2
    path.write_text(yaml.safe_dump(config_data(replicas=("a", "c"))))
    await state.reload()
    route = state.routes["m"]
    assert route.router is router and route.pool.get("a") is replica and replica.in_flight == 2
    assert [r.replica_id for r in route.pool] == ["a", "c"]


async def test_reload_rebuilds_router_when_policy_changes(tmp_path: Path) -> None:
    state, path = await started(tmp_path, config_data())
    old = state.routes["m"].router
    path.write_text(yaml.safe_dump(config_data("least_loaded")))
    await state.reload()
    assert state.routes["m"].router is not old and state.routes["m"].router.policy.type == "least_loaded"


async def test_bad_reload_changes_nothing(tmp_path: Path) -> None:
    state, path = await started(tmp_path, config_data())
    before = (state.config, dict(state.routes))
    path.write_text(yaml.safe_dump(config_data("no_such_policy")))
    with pytest.raises(ConfigError, match="pools.m.routing.policy"):
        await state.reload()
    assert (state.config, state.routes) == before


async def test_unknown_model_and_capacity_sync(tmp_path: Path) -> None:
    state, _ = await started(tmp_path, config_data())
    with pytest.raises(NotFoundError, match="Served models: m"):
        state.route_for("x")
    replica = state.routes["m"].pool.get("a")
    assert replica is not None
    replica.load.num_gpu_blocks, replica.load.block_size = 100, 32
    state.sync_capacity()
    index = state.routes["m"].router.index
    assert isinstance(index, MemoryIndex) and index.capacity("a") == 200  # 32-token blocks, 16-token hash blocks


async def test_a_replaced_router_is_closed_when_its_last_request_ends(tmp_path: Path) -> None:
    state, path = await started(tmp_path, config_data())
    old = state.routes["m"].router
    closed: list[object] = []
    old.index.close = lambda: _note(closed, old)  # type: ignore[method-assign]
    with state.using(old):
        path.write_text(yaml.safe_dump(config_data("least_loaded")))
        await state.reload()
        assert closed == [], "closed while a request still routed with it"
    await asyncio.sleep(0)  # the close runs as a task
    assert closed == [old]
    new = state.routes["m"].router
    new.index.close = lambda: _note(closed, new)  # type: ignore[method-assign]
    path.write_text(yaml.safe_dump(config_data("round_robin")))
    await state.reload()  # no request on it: closed by the reload itself
    assert closed == [old, new]
    await state.close()


async def _note(closed: list[object], router: object) -> None:
    closed.append(router)
