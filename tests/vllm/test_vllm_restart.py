"""A vLLM replica that restarts comes back with an empty cache: the gateway drops its table when it
goes down, so no decision trusts the old one. (Last in the session: it costs one vLLM start-up.)"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.gateway_procs import Gateway
from tests.integration.reliability_tools import eventually
from tests.vllm.conftest import MODEL, VLLMPair, chat_turn, explain, feed
from tests.vllm.test_vllm_cache_state import QUESTIONS, converse, system_prompt

pytestmark = pytest.mark.timeout(420)


def test_a_restarted_replicas_table_is_dropped_before_it_can_mislead(vllm: VLLMPair, gateway: Gateway) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt()}]
    home = converse(gateway, messages, QUESTIONS[:2])[-1].replica
    body = {"model": MODEL, "messages": [*messages, {"role": "user", "content": QUESTIONS[2]}], "max_tokens": 8}
    assert next(c["cached_tokens"] for c in explain(gateway, body)["candidates"] if c["replica"] == home) > 0
    vllm.restart(int(home.rsplit("-", 1)[1]))
    eventually(lambda: gateway.replicas(MODEL)[home]["available"], timeout_s=30)
    assert feed(gateway, home)["blocks"] == 0
    assert all(c["cached_tokens"] == 0 for c in explain(gateway, body)["candidates"] if c["replica"] == home)
    messages.append({"role": "user", "content": QUESTIONS[2]})
    turn, _ = chat_turn(gateway, messages)
    assert turn.predicted == turn.reported, turn
    eventually(lambda: feed(gateway, home)["certain"], timeout_s=30)  # the new engine's history is in sync
