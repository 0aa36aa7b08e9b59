"""The simulator's cost model: how long one scheduler step takes on the modelled hardware.

Defaults were fitted on SmolLM2-135M (bf16, 2 CPU threads). For a prefill chunk of n new
tokens after c already computed (cached or earlier chunks):

    prefill_ms = prefill_base_ms + prefill_token_ms * n + prefill_attention_ms * n * (c + n/2) / 1000

and a decode step of one sequence with ctx context tokens costs

    decode_ms = decode_base_ms + decode_context_ms * ctx / 1000.

A step is one forward pass: the weights are read once, so the base cost is paid once per
step (the prefill base if the step prefills anything, else the decode base). Each prefill
chunk adds its token and attention terms; each decoding sequence adds its context term
(its KV is read) plus a small `decode_seq_ms` (sampling, per-row work). So a batched
decode step costs far less than the sum of its sequences' solo steps, as on real hardware.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TimingModel:
    prefill_base_ms: float = 28.3
    prefill_token_ms: float = 0.362
    prefill_attention_ms: float = 0.812
    decode_base_ms: float = 22.3
    decode_context_ms: float = 21.0
    decode_seq_ms: float = 0.5

    def validate(self) -> None:
        for name in self.__dataclass_fields__:
            if getattr(self, name) < 0:
                raise ValueError(f"timing.{name} must be >= 0")

    def prefill_ms(self, num_new: int, num_computed: int) -> float:
        """Token and attention terms of one prefill chunk (no base)."""
        attention = self.prefill_attention_ms * num_new * (num_computed + num_new / 2) / 1000
        return self.prefill_token_ms * num_new + attention

    def decode_ms(self, context: int) -> float:
        """Per-sequence terms of one decode row (no base)."""
        return self.decode_seq_ms + self.decode_context_ms * context / 1000

    def step_ms(self, prefills: Iterable[tuple[int, int]], decode_contexts: Iterable[int]) -> float:
        """Cost of one step: `prefills` are (num_new, num_computed) chunks, `decode_contexts`
        the context length of each decoding sequence."""
        # prefill_ms / decode_ms inlined (the simulator calls this once per step), same arithmetic
        token_ms, attention_ms = self.prefill_token_ms, self.prefill_attention_ms
        prefill = [token_ms * n + attention_ms * n * (c + n / 2) / 1000 for n, c in prefills]
        seq_ms, context_ms = self.decode_seq_ms, self.decode_context_ms
        decode = [seq_ms + context_ms * ctx / 1000 for ctx in decode_contexts]
        if not prefill and not decode:
            return 0.0
        base = self.prefill_base_ms if prefill else self.decode_base_ms
        extra = self.decode_seq_ms if decode and not prefill else 0.0  # one sequence costs exactly decode_ms
        return base + sum(prefill) + sum(decode) - extra

    def solo_prefill_ms(self, num_new: int, num_cached: int = 0) -> float:
        """Whole-prompt prefill of one request (the issue's formula)."""
        return self.prefill_base_ms + self.prefill_ms(num_new, num_cached)

    def solo_decode_ms(self, context: int) -> float:
        return self.decode_base_ms + self.decode_context_ms * context / 1000
