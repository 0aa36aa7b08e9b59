"""The stub's LoRA adapters: flags, the model check, and adapters never sharing cached blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.errors import NotFoundError
from replica_stub.block_pool import BlockPool, BlockStored, KVEvent
from replica_stub.engine.simulated import SimEngine
from replica_stub.engine.timing import TimingModel
from replica_stub.kv_cache import KVCacheManager
from replica_stub.lora import Lora, cards, parse_modules, resolve
from replica_stub.request import Request, SamplingParams
from tests.unit.replica_stub.test_config import _overrides
from tests.unit.replica_stub.test_simulated import _generate

pytestmark = pytest.mark.timeout(10)

SQL, CHAT = Lora(1, "sql", "/loras/sql"), Lora(2, "chat", "/loras/chat")


def test_lora_modules_flag_and_yaml_number_adapters_in_order(tmp_path: Path) -> None:
    from replica_stub.config import load_config

    config = load_config(None, _overrides(["--model", "base", "--lora-modules", "sql=/loras/sql", "chat=/loras/chat"]))
    assert config.loras == {"sql": SQL, "chat": CHAT}
    path = tmp_path / "stub.yaml"
    path.write_text("lora_modules: [sql=/loras/sql]\n")
    assert load_config(str(path), {}).loras == {"sql": SQL}
    for bad in (["sql"], ["sql=/a", "sql=/b"], ["stub-model=/a"]):
        with pytest.raises(ValueError, match="lora_modules"):
            load_config(None, {"lora_modules": bad})


def test_a_request_names_the_base_model_or_a_served_adapter() -> None:
    loras = parse_modules(["sql=/loras/sql"], "base")
    assert resolve("base", "base", loras) is None and resolve(None, "base", loras) is None
    assert resolve("sql", "base", loras) == SQL
    with pytest.raises(NotFoundError, match="The model `other` does not exist"):
        resolve("other", "base", loras)
    assert cards(loras, "base", 1) == [
        {"id": "sql", "object": "model", "created": 1, "owned_by": "vllm", "root": "/loras/sql", "parent": "base"}
    ]


def _request(prompt: list[int], lora: Lora | None) -> Request:
    return Request(f"r-{lora}-{len(prompt)}", prompt, SamplingParams(max_tokens=4), 4, lora=lora)


def test_adapters_salt_the_block_hashes_and_never_share_cached_blocks() -> None:
    prompt = list(range(12))
    base, sql, chat = (_request(prompt, lora) for lora in (None, SQL, CHAT))
    assert len({tuple(r.block_hashes) for r in (base, sql, chat)}) == 3
    assert _request(prompt, SQL).block_hashes == sql.block_hashes  # deterministic, like vLLM's extra keys
    events: list[KVEvent] = []
    kv = KVCacheManager(BlockPool(16, 4, on_event=events.append))
    assert kv.allocate_slots(sql, 12)
    assert kv.get_computed_blocks(base) == ([], 0) and kv.get_computed_blocks(chat) == ([], 0)
    assert kv.get_computed_blocks(_request(prompt, SQL))[1] == 8  # the same adapter hits
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert [(e.lora_id, e.lora_name) for e in stored] == [(1, "sql")]


async def test_an_adapter_changes_the_sim_engines_text() -> None:
    engine = SimEngine(TimingModel(), speedup=1000, output_len=(50, 50))
    texts = [
        await _generate(
            engine, Request(f"t{i}", [1, 2, 3, 4, 5], SamplingParams(max_tokens=10, seed=1), 4, lora=lora), 4
        )
        for i, lora in enumerate((None, SQL, SQL))
    ]
    assert texts[0] != texts[1] == texts[2]
