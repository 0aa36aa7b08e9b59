"""One conversation's own system prompt is never spread, whatever the block size: two stubs publishing
KV events with 16- and with 128-token blocks (vLLM's GPU and CPU defaults; vLLM on this CPU has only
128, see tests/vllm/test_vllm_defaults.py), a gateway keying by tokens, one conversation alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import free_port
from tests.integration.gateway_procs import MODEL, STEADY_HEALTH, Stub, running, start_gateway
from tests.integration.reliability_tools import eventually

pytestmark = pytest.mark.timeout(60)
SYSTEM = "You are the archivist of one family's letters; " + "answer from the letters only. " * 40


@pytest.mark.parametrize("block", [16, 128])
def test_one_conversation_stays_home_whatever_the_block_size(tmp_path: Path, block: int) -> None:
    with running() as track:
        replicas = []
        for i in range(2):
            events, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
            stub = track(
                Stub(f"replica-{i}", free_port(), MODEL, 50).start(
                    "--block-size", str(block), "--kv-events-endpoint", events, "--kv-events-replay-endpoint", replay
                )
            )
            replicas.append(
                {"url": stub.url, "name": stub.replica_id, "kv_events": {"endpoint": events, "replay_endpoint": replay}}
            )
        pool = {
            "replicas": replicas,
            "routing": {"policy": "prefix_affinity", "prefix": {"tokenizer": "sim", "block_tokens": block}},
        }
        gateway = track(start_gateway(tmp_path, {MODEL: pool}, health=STEADY_HEALTH))
        eventually(lambda: all(r["kv_events"]["certain"] for r in gateway.replicas().values()), timeout_s=10)
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        homes, reasons = [], []
        for turn in range(6):
            messages.append({"role": "user", "content": f"Letter {turn}?"})
            answer = httpx.post(
                f"{gateway.url}/v1/chat/completions",
                timeout=20,
                json={"model": MODEL, "messages": messages, "max_tokens": 4},
            )
            assert answer.status_code == 200, answer.text
            homes.append(answer.headers["X-Replica-Id"])
            reasons.append(answer.headers["X-Affinity-Reason"])
            messages.append({"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"]})
        assert homes == [homes[0]] * 6, (homes, reasons, gateway.replicas())
