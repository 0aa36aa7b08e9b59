"""Seeded workload generators: sessions of chat turns with realistic prefix sharing.

A workload is a list of `Session`s. Each session is one conversation (or one single-shot
request): its turns run in order, each turn's prompt is the system prompt, the history so far
(with the real answers the server gave) and the next user message. That is what makes the
multi-turn shape honest: turn n+1 repeats turn n and its answer, as a chat client would send.
Everything is generated from a seed, with no downloads.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# ~1 token per word for the stub's tokenizer and for BPE tokenizers on plain English words.
_WORDS = (
    "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river mountain forest ocean "
    "signal vector matrix kernel buffer socket thread engine router replica cache prefix block token "
    "stream window cluster latency budget request answer question system policy metric sample "
    "orange purple silver golden copper marble velvet cotton paper glass stone water fire earth"
).split()


@dataclass(frozen=True, slots=True)
class Session:
    """One conversation: `user_turns` are sent one after another, each after `think_s`."""

    session_id: str
    start_s: float
    system: str
    user_turns: tuple[str, ...]
    max_tokens: int
    think_s: float = 0.0


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(count))


def multi_turn(
    *, users: int = 16, rounds: int = 5, systems: int = 2, system_tokens: int = 300,
    question_tokens: int = 60, first_turn_tokens: int = 600, answer_tokens: int = 40,
    rate_per_s: float = 4.0, think_s: float = 0.0, seed: int = 0,
) -> list[Session]:
    """U users, R rounds each, a few shared system prompts, a private history that grows per turn.

    The first user turn carries a long private document so that the conversation's own history
    is most of its prompt (the shape where affinity pays off most).
    """
    rng = random.Random(seed)
    system_prompts = [f"You are assistant {i}. " + words(rng, system_tokens) for i in range(systems)]
    sessions = []
    start = 0.0
    for user in range(users):
        turns = [f"Document for user {user}: " + words(rng, first_turn_tokens)]
        turns += [f"Question {r} from user {user}: " + words(rng, question_tokens) for r in range(1, rounds)]
        sessions.append(Session(f"user-{user}", start, system_prompts[user % systems], tuple(turns),
                                answer_tokens, think_s))
        start += rng.expovariate(rate_per_s)
    return sessions


def hot_prefix(
    *, requests: int = 64, system_tokens: int = 1000, question_tokens: int = 40,
    answer_tokens: int = 20, rate_per_s: float = 20.0, seed: int = 0,
) -> list[Session]:
    """One system prompt shared by every request, Poisson arrivals: the hot-spot trap."""
    rng = random.Random(seed)
    system = "Shared system prompt. " + words(rng, system_tokens)
    sessions = []
    start = 0.0
    for i in range(requests):
        sessions.append(Session(f"req-{i}", start, system, (f"Question {i}: " + words(rng, question_tokens),),
                                answer_tokens))
        start += rng.expovariate(rate_per_s)
    return sessions
