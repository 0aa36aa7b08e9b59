"""Seeded workload generators: sessions of chat turns with realistic prefix sharing.

A workload is a list of `Session`s. Each session is one conversation (or one single-shot
request): its turns run in order, each turn's prompt is the system prompt, the history so far
(with the real answers the server gave) and the next user message. That is what makes the
multi-turn and agent-loop shapes honest: turn n+1 repeats turn n and its answer, as a chat
client or an agent framework would send. Everything is generated from a seed, with no downloads.
Sizes are in words: one word is one token for the replica stub's tokenizer (and about one for
BPE tokenizers on plain English words).

    sessions = build("shared-prefix", {"groups": 8, "rate_per_s": 4}, seed=1)
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from lab.stress_workloads import rag_chunks, tenant_bursts
from lab.wordgen import Session as Session
from lab.wordgen import arrivals as _arrivals
from lab.wordgen import below as below
from lab.wordgen import words as words


def shared_prefix(
    *,
    groups: int = 64,
    prompts_per_group: int = 16,
    system_tokens: int = 2048,
    question_tokens: int = 128,
    answer_tokens: int = 256,
    rate_per_s: float = 8.0,
    seed: int = 0,
) -> list[Session]:
    """G groups × P prompts: a long system prompt per group plus a short question (SGLang's
    generated-shared-prefix shape), requests of all groups interleaved at random, Poisson arrivals."""
    rng = random.Random(seed)
    systems = [f"Group {g} instructions. " + words(rng, system_tokens) for g in range(groups)]
    pairs = [(g, p) for g in range(groups) for p in range(prompts_per_group)]
    rng.shuffle(pairs)
    return [
        Session(f"g{g}-p{p}", start, systems[g], (f"Question {p}: " + words(rng, question_tokens),), answer_tokens)
        for (g, p), start in zip(pairs, _arrivals(rng, len(pairs), rate_per_s))
    ]


def multi_turn(
    *,
    users: int = 16,
    rounds: int = 5,
    systems: int = 2,
    system_tokens: int = 300,
    question_tokens: int = 60,
    first_turn_tokens: int = 600,
    answer_tokens: int = 40,
    rate_per_s: float = 4.0,
    think_s: float = 0.0,
    tenant_skew: float = 0.0,
    seed: int = 0,
) -> list[Session]:
    """U users, R rounds each, a few shared system prompts, a private history that grows per turn.

    The first user turn carries a long private document so that the conversation's own history
    is most of its prompt (the shape where affinity pays off most; production-stack's multi-round
    QA is `system_tokens=1000 first_turn_tokens=2000 answer_tokens=100`). `rate_per_s` is the rate
    at which users arrive; their later turns follow their own answers after `think_s`.
    Each system prompt is one tenant's; `tenant_skew` > 0 makes tenants unequal (tenant i gets a
    share of users proportional to 1 / (i + 1) ** skew; 0 = round robin over tenants).
    """
    rng = random.Random(seed)
    system_prompts = [f"You are assistant {i}. " + words(rng, system_tokens) for i in range(systems)]
    tenant_of = _tenants(users, systems, tenant_skew)
    sessions = []
    start = 0.0
    for user in range(users):
        turns = [f"Document for user {user}: " + words(rng, first_turn_tokens)]
        turns += [f"Question {r} from user {user}: " + words(rng, question_tokens) for r in range(1, rounds)]
        sessions.append(
            Session(f"user-{user}", start, system_prompts[tenant_of[user]], tuple(turns), answer_tokens, think_s)
        )
        start += rng.expovariate(rate_per_s)
    return sessions


def _tenants(users: int, tenants: int, skew: float) -> list[int]:
    """Each user's tenant: round robin when `skew` is 0, else shares ∝ 1/(i+1)**skew, interleaved."""
    if skew <= 0:
        return [user % tenants for user in range(users)]
    weights = [1 / (i + 1) ** skew for i in range(tenants)]
    given = [0] * tenants
    out = []
    for user in range(users):  # the tenant furthest below its share goes next: deterministic, interleaved
        owed = [w * (user + 1) / sum(weights) - g for w, g in zip(weights, given)]
        tenant = owed.index(max(owed))
        given[tenant] += 1
        out.append(tenant)
    return out


def hot_tenant(
    *,
    requests: int = 400,
    hot_share: float = 0.6,
    hot_system_tokens: int = 3000,
    tenants: int = 8,
    system_tokens: int = 1000,
    question_tokens: int = 100,
    answer_tokens: int = 64,
    rate_per_s: float = 8.0,
    seed: int = 0,
) -> list[Session]:
    """One tenant's long system prompt carries `hot_share` of the traffic; the rest is spread over
    `tenants` smaller tenants. Single requests, Poisson arrivals: a hot spot that also has a tail."""
    rng = random.Random(seed)
    hot = "Hot tenant instructions. " + words(rng, hot_system_tokens)
    others = [f"Tenant {t} instructions. " + words(rng, system_tokens) for t in range(tenants)]
    sessions = []
    for i, start in enumerate(_arrivals(rng, requests, rate_per_s)):
        system = hot if rng.random() < hot_share else others[rng.randrange(tenants)]
        sessions.append(
            Session(f"req-{i}", start, system, (f"Question {i}: " + words(rng, question_tokens),), answer_tokens)
        )
    return sessions


def hot_prefix(
    *,
    requests: int = 64,
    system_tokens: int = 1000,
    question_tokens: int = 40,
    answer_tokens: int = 20,
    rate_per_s: float = 20.0,
    seed: int = 0,
) -> list[Session]:
    """One system prompt shared by every request, Poisson arrivals: the hot-spot trap."""
    rng = random.Random(seed)
    system = "Shared system prompt. " + words(rng, system_tokens)
    sessions = []
    start = 0.0
    for i in range(requests):
        sessions.append(
            Session(f"req-{i}", start, system, (f"Question {i}: " + words(rng, question_tokens),), answer_tokens)
        )
        start += rng.expovariate(rate_per_s)
    return sessions


def agent_loop(
    *,
    sessions: int = 32,
    min_hops: int = 3,
    max_hops: int = 8,
    tools_tokens: int = 800,
    task_tokens: int = 200,
    tool_output_tokens: int = 300,
    answer_tokens: int = 60,
    tool_latency_s: float = 0.2,
    rate_per_s: float = 2.0,
    seed: int = 0,
) -> list[Session]:
    """Agent sessions of 3–8 hops: each hop's prompt is the previous prompt, the model's answer (a
    tool call) and the tool's output, so n hops are n requests and their TTFTs add up."""
    rng = random.Random(seed)
    tools = "You are an agent. Tools: " + words(rng, tools_tokens)
    out = []
    for i, start in enumerate(_arrivals(rng, sessions, rate_per_s)):
        hops = rng.randint(min_hops, max_hops)
        turns = [f"Task {i}: " + words(rng, task_tokens)]
        turns += [f"Tool output {h}: " + words(rng, tool_output_tokens) for h in range(1, hops)]
        out.append(Session(f"agent-{i}", start, tools, tuple(turns), answer_tokens, tool_latency_s))
    return out


def varied_output(
    *,
    requests: int = 200,
    prompt_tokens: int = 100,
    short_tokens: int = 32,
    long_tokens: int = 512,
    long_share: float = 0.2,
    rate_per_s: float = 4.0,
    seed: int = 0,
) -> list[Session]:
    """Single requests whose answers differ widely in length: most up to `short_tokens`, a
    `long_share` of them up to `long_tokens` (each from the upper half of its range), private
    prompts, Poisson arrivals. The shape where static batching holds short answers behind long ones
    (its batch runs until its longest answer ends) and continuous batching does not."""
    rng = random.Random(seed)
    sessions = []
    for i, start in enumerate(_arrivals(rng, requests, rate_per_s)):
        top = long_tokens if rng.random() < long_share else short_tokens
        sessions.append(
            Session(
                f"req-{i}",
                start,
                "",
                (f"Request {i}: " + words(rng, prompt_tokens),),
                rng.randint(max(1, top // 2), top),
            )
        )
    return sessions


def trace(
    *, path: str, rate_per_s: float = 0.0, limit: int = 0, block_tokens: int = 512, seed: int = 0
) -> list[Session]:
    """Replay a Mooncake-format JSONL trace: one request per line with `timestamp` (ms),
    `input_length`, `output_length` and `hash_ids` (one per `block_tokens`-token block).

    Each hash id becomes the same deterministic block of words wherever it appears, so requests
    share exactly the prefixes the trace says they share. `rate_per_s` > 0 rescales the
    timestamps to that mean request rate; `limit` > 0 keeps the first that many lines.
    """
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rows.append(orjson.loads(line))
            if limit and len(rows) >= limit:
                break
    if not rows:
        return []
    blocks: dict[int, list[str]] = {}
    t0 = rows[0]["timestamp"] / 1000
    span = rows[-1]["timestamp"] / 1000 - t0
    scale = (len(rows) - 1) / span / rate_per_s if rate_per_s > 0 and span > 0 else 1.0
    sessions = []
    for i, row in enumerate(rows):
        text: list[str] = []
        for hash_id in row["hash_ids"]:
            if hash_id not in blocks:
                blocks[hash_id] = words(random.Random(f"{seed}:{hash_id}"), block_tokens).split(" ")
            text += blocks[hash_id]
        need = int(row["input_length"])
        while len(text) < need:  # a trace line longer than its hash ids: private tail
            text += words(random.Random(f"{seed}:tail:{i}"), need - len(text)).split(" ")
        sessions.append(
            Session(
                f"trace-{i}",
                (row["timestamp"] / 1000 - t0) * scale,
                "",
                (" ".join(text[: max(1, need)]),),
                max(1, int(row["output_length"])),
            )
        )
    return sessions


WORKLOADS: dict[str, Callable[..., list[Session]]] = {
    "shared-prefix": shared_prefix,
    "multi-turn": multi_turn,
    "hot-prefix": hot_prefix,
    "agent-loop": agent_loop,
    "trace": trace,
    "hot-tenant": hot_tenant,
    "varied-output": varied_output,
    # The shapes above with the defaults of the head-to-head against other routers (bench/peers_matrix.py):
    # long-document chat over tenants of unequal size; more prefix groups than the fleet's caches hold.
    "tenant-chat": partial(
        multi_turn,
        users=48,
        rounds=6,
        systems=4,
        system_tokens=400,
        first_turn_tokens=1200,
        question_tokens=40,
        answer_tokens=48,
        tenant_skew=1.0,
        think_s=1.0,
        rate_per_s=1.0,
    ),
    "prefix-groups": partial(
        shared_prefix,
        groups=120,
        prompts_per_group=5,
        system_tokens=2500,
        question_tokens=60,
        answer_tokens=32,
        rate_per_s=4.0,
    ),
    # The stress families (lab/stress_workloads.py): bursts, RAG chunks in varying order, long answers.
    "tenant-bursts": tenant_bursts,
    "rag-chunks": rag_chunks,
    "decode-heavy": partial(
        multi_turn,
        users=96,
        rounds=3,
        systems=4,
        system_tokens=300,
        first_turn_tokens=200,
        question_tokens=40,
        answer_tokens=384,
        think_s=1.0,
        rate_per_s=3.0,
    ),
}


def parameters(name: str) -> dict[str, Any]:
    """The workload's parameters and their defaults (`path` of `trace` has none: None)."""
    params = inspect.signature(WORKLOADS[name]).parameters.values()
    return {p.name: (None if p.default is inspect.Parameter.empty else p.default) for p in params}


def build(name: str, params: Mapping[str, str | int | float], *, seed: int | None = None) -> list[Session]:
    """Generate workload `name`; string values (from the command line) are converted to the
    parameter's type. Raises ValueError naming an unknown workload or parameter."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r} (known: {', '.join(WORKLOADS)})")
    defaults = parameters(name)
    kwargs: dict[str, Any] = {}
    for key, value in params.items():
        key = key.replace("-", "_")
        if key not in defaults:
            raise ValueError(f"workload {name!r} has no parameter {key!r} (has: {', '.join(defaults)})")
        default = defaults[key]
        kwargs[key] = type(default)(value) if isinstance(value, str) and default is not None else value
    if seed is not None:
        kwargs["seed"] = seed
    return WORKLOADS[name](**kwargs)


def num_requests(sessions: list[Session]) -> int:
    return sum(len(s.user_turns) for s in sessions)
