"""Issue 34's workload families: seeded, registered, and the shape each promises, measured on its output."""

from __future__ import annotations

from collections import Counter

import pytest

from lab import workloads
from lab.stress_workloads import rag_chunks, tenant_bursts

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("name", ["tenant-bursts", "rag-chunks", "decode-heavy"])
def test_registered_and_the_same_for_a_seed(name: str) -> None:
    first, again, other = (workloads.build(name, {}, seed=s) for s in (3, 3, 4))
    assert first == again
    assert first != other
    assert workloads.num_requests(first) >= 200


def test_several_tenants_burst_at_once_and_one_burst_is_several_times_the_others() -> None:
    sessions = tenant_bursts(waves=6, background_per_s=0.0, seed=1)
    biggest, second = 0, 0
    for wave in range(6):
        inside = [s for s in sessions if wave * 4.0 <= s.start_s < wave * 4.0 + 2.0]
        per_tenant = Counter(s.system for s in inside).most_common()
        assert len(per_tenant) == 3, per_tenant  # three tenants burst in each wave
        biggest, second = biggest + per_tenant[0][1], second + per_tenant[1][1]
    assert biggest >= 2 * second  # the big one bursts at 4x the rate of the others (Poisson noise aside)
    quiet = [s for s in sessions if any(w * 4.0 + 2.0 <= s.start_s < (w + 1) * 4.0 for w in range(6))]
    assert not quiet  # off between bursts (no background asked for)


def test_rag_prompts_share_chunks_but_rarely_their_order() -> None:
    sessions = rag_chunks(requests=300, seed=2)
    assert len({s.system for s in sessions}) == 1
    chunk_sets = Counter(frozenset(s.user_turns[0].split("\n")[1:5]) for s in sessions)
    orders = Counter(tuple(s.user_turns[0].split("\n")[1:5]) for s in sessions)
    assert max(chunk_sets.values()) >= 3  # the same chunks retrieved again...
    assert max(orders.values()) < max(chunk_sets.values())  # ...in another order


def test_decode_heavy_answers_are_long_against_their_prompts() -> None:
    sessions = workloads.build("decode-heavy", {}, seed=0)
    assert all(s.max_tokens >= 384 and len(s.user_turns) == 3 for s in sessions)
    assert all(len(s.user_turns[0].split()) < s.max_tokens for s in sessions)
