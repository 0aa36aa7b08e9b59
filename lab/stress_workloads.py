"""Workload families that stress what steady Poisson traffic hides: tenants whose traffic
comes in bursts, RAG prompts whose shared chunks come in a different order each time, and long answers.

Each is seeded and registered in `lab.workloads.WORKLOADS`, so `affinity-gateway simulate -w tenant-bursts`
(or `rag-chunks`, `decode-heavy`) runs it. `rate_per_s` scales each family's arrivals, as `--rate` does
for the others.
"""

from __future__ import annotations

import random

from lab.wordgen import Session, arrivals, words


def tenant_bursts(
    *,
    tenants: int = 8,
    system_tokens: int = 1500,
    question_tokens: int = 80,
    answer_tokens: int = 32,
    waves: int = 30,
    wave_s: float = 4.0,
    bursting: int = 3,
    burst_s: float = 1.5,
    big_factor: float = 4.0,
    background_per_s: float = 1.0,
    rate_per_s: float = 6.0,
    seed: int = 0,
) -> list[Session]:
    """Tenants that are quiet, then burst: every `wave_s`, `bursting` tenants (drawn at random) each send
    Poisson traffic at `rate_per_s` for `burst_s`, starting within a third of a burst of each other;
    the first of each wave bursts `big_factor` times harder, more than one replica serves (a home
    replica that keeps it builds a queue). Under the waves, `background_per_s` requests of random
    tenants keep every tenant's prompt warm somewhere. One request per session: the tenant's long
    system prompt, a short question."""
    rng = random.Random(seed)
    systems = [f"Tenant {t} instructions. " + words(rng, system_tokens) for t in range(tenants)]
    picks: list[tuple[float, int]] = []  # (start, tenant)
    for wave in range(waves):
        start = wave * wave_s
        for rank, tenant in enumerate(rng.sample(range(tenants), min(bursting, tenants))):
            rate = rate_per_s * (big_factor if rank == 0 else 1.0)
            begin = start + rng.uniform(0.0, burst_s / 3)
            at = begin + rng.expovariate(rate)
            while at < begin + burst_s:
                picks.append((at, tenant))
                at += rng.expovariate(rate)
    if background_per_s > 0:
        for at in arrivals(rng, int(waves * wave_s * background_per_s), background_per_s):
            picks.append((at, rng.randrange(tenants)))
    picks.sort()
    return [
        Session(
            f"t{tenant}-{i}", at, systems[tenant], (f"Question {i}: " + words(rng, question_tokens),), answer_tokens
        )
        for i, (at, tenant) in enumerate(picks)
    ]


def rag_chunks(
    *,
    requests: int = 400,
    topics: int = 8,
    chunks_per_topic: int = 6,
    chunk_tokens: int = 300,
    chunks_per_request: int = 4,
    system_tokens: int = 300,
    question_tokens: int = 40,
    answer_tokens: int = 48,
    topic_skew: float = 1.0,
    rate_per_s: float = 12.0,
    seed: int = 0,
) -> list[Session]:
    """Retrieval-augmented prompts: one shared system prompt, then `chunks_per_request` document chunks
    retrieved from one topic's pool, in the order the retriever ranked them (shuffled per request), then
    the question. Requests of a topic share chunks but rarely their order, so a prefix cache hits the
    system prompt and, when the first chunk matches, that chunk: a router that counts shared *content*
    as a hit is wrong here. Topics are Zipf-skewed (`topic_skew`); Poisson arrivals."""
    rng = random.Random(seed)
    system = "You answer from the retrieved context only. " + words(rng, system_tokens)
    pools = [[f"[doc {t}.{c}] " + words(rng, chunk_tokens) for c in range(chunks_per_topic)] for t in range(topics)]
    weights = [1 / (t + 1) ** topic_skew for t in range(topics)]
    sessions = []
    for i, at in enumerate(arrivals(rng, requests, rate_per_s)):
        topic = rng.choices(range(topics), weights)[0]
        chunks = rng.sample(pools[topic], min(chunks_per_request, chunks_per_topic))
        prompt = "Context:\n" + "\n".join(chunks) + f"\nQuestion {i}: " + words(rng, question_tokens)
        sessions.append(Session(f"rag-{i}", at, system, (prompt,), answer_tokens))
    return sessions
