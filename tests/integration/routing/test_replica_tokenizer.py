"""Token-exact keys from a replica's own /tokenize: the same ids the replica's engine computes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.prompt.prompt_keys import PromptKeys
from gateway.prompt.replica_tokenizer import ReplicaTokenizer
from gateway.prompt.tokenizers import SimPromptTokenizer
from tests.helpers import free_port
from tests.integration.gateway_procs import MODEL, Stub, start_stub

pytestmark = pytest.mark.timeout(30)
SYSTEM = {"role": "system", "content": "You are terse and exact. " * 8}


@pytest.fixture(scope="module")
def stub() -> Iterator[Stub]:
    stub = start_stub("tokenize-0")
    yield stub
    stub.stop()


def conversation(turns: int) -> list[dict[str, str]]:
    messages = [SYSTEM]
    for i in range(turns):
        messages += [
            {"role": "user", "content": f"question {i}: " + "why is the sky blue? " * 5},
            {"role": "assistant", "content": f"answer {i}: " + "light scatters. " * 7},
        ]
    return messages + [{"role": "user", "content": "and at sunset?"}]


async def test_ids_and_preamble_equal_the_engines_and_the_preamble_is_asked_once(stub: Stub) -> None:
    remote = ReplicaTokenizer(MODEL, lambda: [stub.url])
    local = SimPromptTokenizer()
    for turns in (0, 1, 3):
        body = {"model": MODEL, "messages": conversation(turns)}
        assert await remote.encode("chat", body) == local.encode("chat", body)
    assert remote.requests == 3 + 1  # one per request, plus the shared system prompt once
    completion = {"model": MODEL, "prompt": "Once upon a time, in a land far away,"}
    assert await remote.encode("completions", completion) == local.encode("completions", completion)
    ids = await remote.encode("completions", {"prompt": [5, 6, 7]})
    assert ids is not None and ids.token_ids == (5, 6, 7)
    await remote.close()


async def test_no_replica_or_a_dead_one_falls_back_and_counts(stub: Stub) -> None:
    body = {"model": MODEL, "messages": conversation(1)}
    none = PromptKeys(ReplicaTokenizer(MODEL, lambda: []), budget_s=1.0)
    assert await none.encode("chat", body) is None
    dead = PromptKeys(ReplicaTokenizer(MODEL, lambda: [f"http://127.0.0.1:{free_port()}"]), budget_s=1.0)
    assert await dead.encode("chat", body) is None and dead.errors == 1
    wrong_model = PromptKeys(ReplicaTokenizer("no-such-model", lambda: [stub.url]), budget_s=1.0)
    assert await wrong_model.encode("chat", body) is None and wrong_model.errors == 1
    for keys in (none, dead, wrong_model):
        await keys.close()
