"""`replica-stub calibrate`: time the real engine on this machine and fit the simulator's TimingModel.

Every measurement goes through `RealEngine.run`, the same step path a served request takes
(prefix gathered from the block store, forward, blocks stored, token sampled), so the fitted
simulator mirrors what a real replica costs here, not what the bare model costs:

- prefill: one request computing n new tokens after c cached ones, for a grid of (n, c);
- decode: one step of b sequences that each hold ctx tokens, for a grid of (b, ctx).

Both are least-squares fits of the formulas in `engine/timing.py`; negative coefficients
(noise) are clamped to zero. The result is written as YAML usable with `replica-stub --config`.
In a checkout of the project, `--results NAME` also publishes the measured-against-fitted table into
docs/benchmarks/results/NAME.json and NAME.md (bench/results.py), which the real model page includes.
"""

from __future__ import annotations

import itertools
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from replica_stub.engine.model import configure_torch_env
from replica_stub.engine.timing import TimingModel
from replica_stub.request import SamplingParams

if TYPE_CHECKING:
    from replica_stub.engine.real import RealEngine, Work

GREEDY = SamplingParams(max_tokens=1, temperature=0)
PREFILL_GRID = [(n, c) for c in (0, 512, 1024) for n in (32, 128, 512, 1024)]
DECODE_GRID = [(b, ctx) for ctx in (128, 1024) for b in (1, 2, 4, 8)]
QUICK_PREFILL_GRID = [(n, c) for c in (0, 256) for n in (32, 256)]
QUICK_DECODE_GRID = [(b, ctx) for ctx in (64, 256) for b in (1, 2)]


@dataclass(frozen=True, slots=True)
class Sample:
    kind: str  # "prefill" | "decode"
    a: int  # prefill: new tokens n; decode: batch size b
    b: int  # prefill: computed tokens c; decode: context ctx
    ms: float


def _lstsq(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    import torch

    solution = torch.linalg.lstsq(
        torch.tensor(rows, dtype=torch.float64), torch.tensor(ys, dtype=torch.float64).unsqueeze(1)
    ).solution
    return [max(0.0, float(v)) for v in solution.squeeze(1)]


def fit(samples: Sequence[Sample]) -> TimingModel:
    """TimingModel coefficients from measured prefill and decode steps."""
    prefill = [s for s in samples if s.kind == "prefill"]
    decode = [s for s in samples if s.kind == "decode"]
    p_base, p_token, p_attn = _lstsq(
        [[1.0, s.a, s.a * (s.b + s.a / 2) / 1000] for s in prefill], [s.ms for s in prefill]
    )
    d_base, d_seq, d_ctx = _lstsq([[1.0, s.a - 1, s.a * s.b / 1000] for s in decode], [s.ms for s in decode])
    model = TimingModel(
        prefill_base_ms=p_base,
        prefill_token_ms=p_token,
        prefill_attention_ms=p_attn,
        decode_base_ms=d_base,
        decode_context_ms=d_ctx,
        decode_seq_ms=d_seq,
    )
    return TimingModel(**{k: round(v, 4) for k, v in asdict(model).items()})


class Bench:
    """Drives a RealEngine with synthetic requests whose blocks sit at known store slots."""

    def __init__(self, engine: RealEngine, repeats: int) -> None:
        from replica_stub.engine.real import Work

        self.engine, self.work, self.repeats = engine, Work, repeats
        self.bs = engine.block_size
        self.rng = random.Random(0)
        self._ids = itertools.count()

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(1000, 40000) for _ in range(n)]

    def _step(self, items: list[Work]) -> float:
        start = time.perf_counter()
        self.engine.run(items)
        return (time.perf_counter() - start) * 1000

    def _fresh(self, blocks: list[int], num_computed: int, new: list[int]) -> Work:
        return self.work(f"cal-{next(self._ids)}", new, num_computed, blocks, True, GREEDY)

    def prefill(self, n: int, c: int) -> float:
        """Median time of a step computing n tokens after c tokens reused from the store."""
        blocks = list(range(-(-(c + n) // self.bs)))
        if c:
            self._step([self._fresh(blocks, 0, self._tokens(c))])
        ms = statistics.median(self._step([self._fresh(blocks, c, self._tokens(n))]) for _ in range(self.repeats))
        self.engine.release_all()
        return ms

    def decode(self, batch: int, ctx: int) -> float:
        """Median time of a decode step of `batch` sequences holding ctx tokens each."""
        blocks = list(range(ctx // self.bs))
        self._step([self._fresh(blocks, 0, self._tokens(ctx))])
        ids = [f"dec-{next(self._ids)}" for _ in range(batch)]
        times = []
        for step in range(self.repeats + 1):
            items = [self.work(rid, [self.rng.randrange(1000, 40000)], ctx + step, blocks, True, GREEDY) for rid in ids]
            times.append(self._step(items))
        self.engine.release_all()
        return statistics.median(times[1:])  # the first step also gathers the prefix from the store


def measure(engine: RealEngine, *, quick: bool = False, repeats: int = 3) -> list[Sample]:
    bench = Bench(engine, repeats)
    bench.prefill(64, 0)  # warm-up
    prefill_grid, decode_grid = (QUICK_PREFILL_GRID, QUICK_DECODE_GRID) if quick else (PREFILL_GRID, DECODE_GRID)
    samples = [Sample("prefill", n, c, bench.prefill(n, c)) for n, c in prefill_grid]
    samples += [Sample("decode", b, ctx, bench.decode(b, ctx)) for b, ctx in decode_grid]
    return samples


def render(figures: dict[str, Any]) -> str:
    """Measured against fitted step times, then the fitted `timing:` (what the simulator would use):
    one rendering for the terminal and the published page."""
    model = TimingModel(**figures["timing"])
    lines = ["| step | new tokens / batch | cached / context | measured ms | fitted ms |", "|---|---|---|---|---|"]
    for s in (Sample(**sample) for sample in figures["samples"]):
        fitted = model.solo_prefill_ms(s.a, s.b) if s.kind == "prefill" else model.step_ms([], [s.b] * s.a)
        lines.append(f"| {s.kind} | {s.a} | {s.b} | {s.ms:.1f} | {fitted:.1f} |")
    timing = ", ".join(f"{name}: {value:g}" for name, value in figures["timing"].items())
    lines += ["", f"Fitted, {figures['threads']} torch thread(s), block size {figures['block_size']}:", ""]
    return "\n".join([*lines, "```yaml", f"timing: {{{timing}}}", "```"])


def run_calibration(
    output: Path, *, threads: int, block_size: int, quick: bool, results_name: str | None = None
) -> TimingModel:
    configure_torch_env()
    from replica_stub.engine.real import RealEngine

    engine = RealEngine(block_size=block_size, kv_cache_mb=512, threads=threads)
    samples = measure(engine, quick=quick)
    model = fit(samples)
    header = (
        f"# replica-stub calibrate: SmolLM2-135M-Instruct, bf16, {threads} torch thread(s), "
        f"block_size {block_size}, measured {time.strftime('%Y-%m-%d %H:%M %Z')}\n"
    )
    output.write_text(header + yaml.safe_dump({"timing": asdict(model)}, sort_keys=False))
    figures = {"threads": threads, "block_size": block_size, "samples": [asdict(s) for s in samples]}
    figures["timing"] = asdict(model)
    print(render(figures))
    print(f"\nwrote {output}: use it with `replica-stub --engine sim --config {output}`")
    if results_name:
        publish(results_name, figures)
    return model


def publish(name: str, figures: dict[str, Any]) -> None:
    """`--results NAME`: bench.results lives in the project's checkout, not in the installed package."""
    try:
        from bench import results
    except ImportError:
        print("replica-stub: --results publishes into a checkout of the project (its bench/ and docs/)")
        return
    print(results.write(name, results.record(__name__, figures, program="replica-stub"), render))
