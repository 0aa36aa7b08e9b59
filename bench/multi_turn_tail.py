"""Where multi-turn TTFT p90 comes from: first turns against later turns, and why the slowest
later turns are slow (the published matrix's multi-turn shape, 8 simulated replicas).

With 10 rounds, first turns are exactly 10% of the requests and carry a 2,000-token private
document no replica holds, so the overall p90 (nearest rank) is the slowest request *below* the
64 slowest: while every later turn is faster than every first turn, that is the slowest later
turn. A ratio "round_robin p90 / prefix_affinity p90 >= X" therefore asks that *no* later turn
be slower than round_robin's p90 / X. This prints, per policy: first-turn and later-turn TTFT,
how many later turns are above round_robin's p90 / 3, and for prefix_affinity what made each of
those slow: the conversation moved off its home (re-prefilling its history), or it stayed home
but arrived while another request's long prefill was running there (a running prefill takes the
step's token budget first, as in vLLM's scheduler, so the newcomer waits for all of it).

    .venv/bin/python -m bench.multi_turn_tail --rate 0.4 [--max-num-batched-tokens 512]
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Sequence
from typing import Any

from bench.policy_matrix import MULTI_TURN
from gateway.request.decision import Candidate, Decision
from gateway.view import RequestView
from lab.results import Result, quantile
from lab.sim_spec import SimSpec
from lab.simulate import Simulation
from lab.workloads import multi_turn
from replica_stub.config import StubConfig

SHAPE = dict(users=64, **MULTI_TURN)  # the 8-replica matrix's multi-turn cells
LONG_PREFILL = 1000  # tokens still to prefill that make a request "long" for this breakdown


def run(policy: str, rate: float, batched_tokens: int) -> tuple[list[Result], dict[tuple[str | None, int], Any]]:
    """Simulate; also note, per (session, turn), the decision and the chosen replica's unfinished prefills."""
    sessions = multi_turn(**SHAPE, rate_per_s=rate, seed=0)
    stub = StubConfig(num_gpu_blocks=4096, max_num_batched_tokens=batched_tokens).resolved()
    sim = Simulation(SimSpec(replicas=8, policy=policy, stub=stub))
    seen: dict[tuple[str | None, int], Any] = {}
    route = sim.router.route

    async def noting(view: RequestView, candidates: Sequence[Candidate]) -> Decision:
        decision = await route(view, candidates)
        scheduler = sim.replicas[decision.replica_id].scheduler
        pending = [len(r.prompt_token_ids) - r.num_computed_tokens for r in [*scheduler.running, *scheduler.waiting]]
        turn = (len(view.body["messages"]) - 2) // 2  # system + user, then an answer and a question a turn
        seen[(view.session_key, turn)] = (decision.reason, max(pending, default=0))
        return decision

    sim.router.route = noting  # type: ignore[method-assign]
    return sim.run(sessions), seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=0.4, help="user arrivals per second (matrix: 0.1 / 0.2 / 0.4)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=StubConfig().max_num_batched_tokens)
    args = parser.parse_args()
    bar = 0.0
    for policy in ("round_robin", "least_loaded", "prefix_affinity"):
        results, seen = run(policy, args.rate, args.max_num_batched_tokens)
        ttfts = sorted(r.ttft_s or 0.0 for r in results)
        first = sorted(r.ttft_s or 0.0 for r in results if r.turn == 0)
        later = [r for r in results if r.turn > 0]
        later_ttfts = sorted(r.ttft_s or 0.0 for r in later)
        if policy == "round_robin":
            bar = quantile(ttfts, 0.9) / 3
        slow = [r for r in later if (r.ttft_s or 0.0) > bar]
        print(
            f"{policy}: TTFT p90 {quantile(ttfts, 0.9):.2f} s | "
            f"first turns ({len(first)}) p10 {quantile(first, 0.1):.2f} "
            f"p50 {quantile(first, 0.5):.2f} s | later turns ({len(later)}) p50 {quantile(later_ttfts, 0.5):.2f} "
            f"p90 {quantile(later_ttfts, 0.9):.2f} p99 {quantile(later_ttfts, 0.99):.2f} max {later_ttfts[-1]:.2f} s "
            f"| later turns above round_robin's p90 / 3 ({bar:.2f} s): {len(slow)}"
        )
        if policy != "prefix_affinity":
            continue
        causes: collections.Counter[str] = collections.Counter()
        for r in slow:
            reason, pending = seen[(r.session_id, r.turn)]
            if r.prompt_tokens - r.cached_tokens > SHAPE["system_tokens"] // 2:
                causes[f"moved off its home ({reason})"] += 1
            elif pending >= LONG_PREFILL:
                causes["home hit, behind another request's long prefill there"] += 1
            else:
                causes["home hit, other"] += 1
        for cause, n in causes.most_common():
            print(f"    {n:3d}  {cause}")


if __name__ == "__main__":
    main()
