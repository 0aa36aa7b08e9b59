"""Labels map to pools, adapters and roles, end to end: a `python -m gateway serve` process watches
`tests.k8s_api` (a stand-in for the API server: no cluster can run here) serving recorded EndpointSlice
events whose labels (copied from their Services, as Kubernetes does) name each slice's pool, its pods'
adapters and their role. Real replica stubs answer behind the slices. Two pools share one selector;
a slice of a third pool joins neither, until it is relabelled. Routing ignores the role."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import free_port
from tests.integration.gateway_procs import Stub, running, start_gateway
from tests.k8s_api import FakeSliceAPI, endpoint_slice

pytestmark = pytest.mark.timeout(90)

QWEN = "Qwen/Qwen3-0.6B"  # a pool name that cannot be a label value: its slices say pool_value
POOL, ROLE, ADAPTER = "affinity-gateway.io/pool", "affinity-gateway.io/role", "adapters.affinity-gateway.io/"
PART_OF = {"app.kubernetes.io/part-of": "llm"}
EVENT_S = 2.0  # a gateway process, its probes and the test's polling: the pool follows each event within this


def kubernetes(kubeconfig: Path, **extra: Any) -> dict[str, Any]:
    return {
        "discovery": {
            "kubernetes": {
                "labels": PART_OF,
                "pool_label": POOL,
                "adapter_label_prefix": ADAPTER,
                "role_label": ROLE,
                "port_name": "http",
                "kubeconfig": str(kubeconfig),
                "retry_s": 0.05,
                **extra,
            }
        },
        "routing": {"policy": "round_robin"},
    }


def labelled(slice_name: str, service: str, pod: str, stub: Stub, **labels: str) -> dict[str, Any]:
    return endpoint_slice(slice_name, service, {pod: ("127.0.0.1", True)}, stub.port, labels={**PART_OF, **labels})


async def until(check: Callable[[], Any], timeout: float = EVENT_S) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "the gateway did not follow the event in time"
        await asyncio.sleep(0.02)


async def test_labels_name_pools_adapters_and_roles_and_relabelling_moves_pods(tmp_path: Path) -> None:
    with running() as track:
        prefill = track(Stub("llama-prefill-0", free_port(), "llama").start("--lora-modules", "sql-lora=/loras/sql"))
        decode = track(Stub("llama-decode-0", free_port(), "llama").start())
        qwen = track(Stub("qwen-0", free_port(), QWEN).start())
        stray = track(Stub("stray-0", free_port(), "llama").start())
        async with FakeSliceAPI() as api:
            await api.put(
                labelled(
                    "llama-prefill-a1",
                    "llama-prefill",
                    "llama-prefill-0",
                    prefill,
                    **{POOL: "llama", ROLE: "prefill", f"{ADAPTER}sql-lora": "true"},
                )
            )
            await api.put(
                labelled("llama-decode-b2", "llama-decode", "llama-decode-0", decode, **{POOL: "llama", ROLE: "decode"})
            )
            await api.put(labelled("qwen-c3", "qwen", "qwen-0", qwen, **{POOL: "qwen3"}))
            await api.put(labelled("mistral-d4", "mistral", "stray-0", stray, **{POOL: "mistral", ROLE: "decode"}))
            kubeconfig = tmp_path / "kubeconfig"
            kubeconfig.write_text(api.kubeconfig())
            pools = {"llama": kubernetes(kubeconfig), QWEN: kubernetes(kubeconfig, pool_value="qwen3")}
            gateway = track(await asyncio.to_thread(start_gateway, tmp_path, pools))
            try:
                async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as client:

                    async def admin() -> dict[str, dict[str, dict[str, Any]]]:
                        answer = (await client.get("/admin/replicas")).json()
                        return {pool: {r["id"]: r for r in answer[pool]["replicas"]} for pool in ("llama", QWEN)}

                    async def served(model: str, n: int) -> set[str]:
                        seen = set()
                        for i in range(n):
                            answer = await client.post(
                                "/v1/completions", json={"model": model, "prompt": f"p{i}", "max_tokens": 1}
                            )
                            assert answer.status_code == 200, answer.text
                            seen.add(answer.headers["X-Replica-Id"])
                        return seen

                    async def roles() -> dict[str, dict[str, str]]:
                        found = await admin()
                        return {pool: {pod: r["role"] for pod, r in found[pool].items()} for pool in found}

                    async def first_roles() -> bool:
                        return await roles() == {
                            "llama": {"llama-prefill-0": "prefill", "llama-decode-0": "decode"},
                            QWEN: {"qwen-0": "both"},
                        }  # no role label: both

                    await until(first_roles)  # the stray pool's slice joins neither
                    assert "sql-lora" in (await admin())["llama"]["llama-prefill-0"]["adapters"]
                    # the role is not routed on: both serve the base model
                    assert await served("llama", 4) == {"llama-prefill-0", "llama-decode-0"}
                    assert await served("sql-lora", 4) == {"llama-prefill-0"}  # only the pod labelled with it
                    assert await served(QWEN, 2) == {"qwen-0"}
                    metrics = (await client.get("/metrics")).text
                    llama_info = (
                        'affinity_gateway_replica_info{model_name="llama",replica="llama-prefill-0",role="prefill"}'
                    )
                    assert f"{llama_info} 1.0" in metrics
                    qwen_info = f'affinity_gateway_replica_info{{model_name="{QWEN}",replica="qwen-0",role="both"}} 1.0'
                    assert qwen_info in metrics

                    await api.put(
                        labelled(
                            "llama-decode-b2", "llama-decode", "llama-decode-0", decode, **{POOL: "llama", ROLE: "both"}
                        )
                    )  # relabelled: the same pod, a new role

                    async def decode_is_both() -> bool:
                        return (await roles())["llama"].get("llama-decode-0") == "both"

                    await until(decode_is_both)
                    await api.put(
                        labelled("mistral-d4", "mistral", "stray-0", stray, **{POOL: "llama", ROLE: "decode"})
                    )

                    async def stray_joined() -> bool:
                        return (await roles())["llama"].get("stray-0") == "decode"

                    await until(stray_joined)  # relabelled into this pool's selector: joins
                    await until(lambda: served_by(client, "llama", "stray-0"))
                    await api.put(labelled("mistral-d4", "mistral", "stray-0", stray, **{POOL: "mistral"}))

                    async def stray_left() -> bool:
                        return set((await admin())["llama"]) == {"llama-prefill-0", "llama-decode-0"}

                    await until(stray_left)  # ...and out of it again: leaves (the watch says DELETED)
                    assert {q["labelSelector"] for q in api.requests} == {  # one selector per pool
                        f"app.kubernetes.io/part-of=llm,{POOL}=llama",
                        f"app.kubernetes.io/part-of=llm,{POOL}=qwen3",
                    }
            finally:  # the gateway goes first: the stand-in closes only once no watch is open
                await asyncio.to_thread(gateway.stop)
                await api.drop_watches()


async def served_by(client: httpx.AsyncClient, model: str, replica_id: str) -> bool:
    """One request: whether `replica_id` answered it (round robin reaches every available replica)."""
    answer = await client.post("/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 1})
    return answer.status_code == 200 and answer.headers["X-Replica-Id"] == replica_id
