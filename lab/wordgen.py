"""The words every seeded workload is made of, and the `Session` it is a list of.

Split from `lab.workloads` so that workload families in other modules (`lab.stress_workloads`) draw
their text and arrivals from the same helpers, with the same seeds giving the same words, and the
registry in `lab.workloads` can import them without a circle.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

WORDS = (
    "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river mountain forest ocean "
    "signal vector matrix kernel buffer socket thread engine router replica cache prefix block token "
    "stream window cluster latency budget request answer question system policy metric sample "
    "orange purple silver golden copper marble velvet cotton paper glass stone water fire earth"
).split()


@dataclass(frozen=True, slots=True)
class Session:
    """One conversation: `user_turns` are sent one after another, each `think_s` after the last answer.

    `max_tokens` is the answer length of every turn (the bench sends `ignore_eos`, so it is exact).
    """

    session_id: str
    start_s: float
    system: str
    user_turns: tuple[str, ...]
    max_tokens: int
    think_s: float = 0.0


def below(rng: random.Random, n: int, count: int) -> list[int]:
    """`count` draws of `rng.randrange(n)` (n >= 1), which is also what `rng.choice` of an n-long
    sequence draws. For a plain `random.Random` they are inlined: `randrange(n)` is `_randbelow(n)`,
    which draws `n.bit_length()` bits until below `n`; so the same state gives the same numbers and
    leaves the same state (tests/unit/lab/test_simulate.py)."""
    if type(rng) is not random.Random:
        return [rng.randrange(n) for _ in range(count)]
    getrandbits, k = rng.getrandbits, n.bit_length()
    out = []
    for _ in range(count):
        r = getrandbits(k)
        while r >= n:
            r = getrandbits(k)
        out.append(r)
    return out


def words(rng: random.Random, count: int) -> str:
    """`count` words, each `rng.choice(WORDS)`."""
    return " ".join([WORDS[i] for i in below(rng, len(WORDS), count)])


def arrivals(rng: random.Random, count: int, rate_per_s: float) -> list[float]:
    """Poisson arrival times (exponential gaps), the first at 0."""
    times, now = [], 0.0
    for _ in range(count):
        times.append(now)
        now += rng.expovariate(rate_per_s)
    return times
