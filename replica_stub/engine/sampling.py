"""Next-token choice from logits, on the torch side: greedy, temperature, top-p, seeded.

Each request gets its own `torch.Generator`: seeded from `seed` when given, so the same
request samples the same tokens whatever else shares its batch; from fresh entropy otherwise.
"""

from __future__ import annotations

import torch

from replica_stub.request import SamplingParams


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """None for greedy requests (no randomness needed)."""
    if params.temperature == 0:
        return None
    generator = torch.Generator()
    if params.seed is None:
        generator.seed()
    else:
        generator.manual_seed(params.seed)
    return generator


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token id from a 1-D logits row (any float dtype; computed in float32)."""
    if params.temperature == 0 or generator is None:
        return int(torch.argmax(logits))
    scaled = logits.float() / params.temperature
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        probs = top_p_filter(probs, params.top_p)
    return int(torch.multinomial(probs, 1, generator=generator))


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches `top_p` (always >= 1 token)."""
    sorted_probs, order = torch.sort(probs, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs[mass_before >= top_p] = 0.0
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum()
