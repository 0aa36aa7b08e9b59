"""The lab's oracle: its replay of the engine predicts the simulator's TTFTs, and it routes in `simulate`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import orjson
import pytest

from gateway.cli.main import main
from gateway.request.decision import Candidate, Decision
from gateway.view import RequestView
from lab.oracle import OraclePolicy
from lab.results import summarise
from lab.sim_spec import SimSpec
from lab.simulate import Simulation, simulate
from lab.stress_workloads import rag_chunks, tenant_bursts
from replica_stub.config import StubConfig

pytestmark = pytest.mark.timeout(60)
FAST = StubConfig(speedup=10).resolved()


def test_the_replay_predicts_each_ttft_up_to_what_arrives_after_it() -> None:
    sessions = tenant_bursts(waves=2, rate_per_s=8.0, seed=3)
    sim = Simulation(SimSpec(replicas=2, policy="oracle", stub=FAST))
    oracle = sim.router.policy
    assert isinstance(oracle, OraclePolicy)
    predicted: dict[str, float] = {}
    choose = oracle.choose

    def recording(view: RequestView, candidates: Sequence[Candidate]) -> Decision:
        decision = choose(view, candidates)
        chosen = next(s for s in decision.scores if s.replica_id == decision.replica_id)
        predicted[view.session_key or ""] = chosen.score
        return decision

    oracle.choose = recording  # type: ignore[method-assign]
    results = sim.run(sessions)
    errors = sorted((r.ttft_s or 0.0) - predicted[r.session_id] for r in results)
    assert len(errors) == len(sessions) > 50
    # Later arrivals can only add work to a step, never take it away: the truth is never below the
    # replay, and with nothing arriving behind a request, the replay is exact.
    assert errors[0] > -1e-9
    exact = sum(abs(e) < 1e-9 for e in errors)
    assert exact >= len(errors) // 4, (exact, len(errors))
    assert errors[-1] > 1e-3  # bursts do arrive behind some requests


def test_the_oracle_beats_round_robin_where_the_cache_decides() -> None:
    sessions = rag_chunks(requests=300, rate_per_s=18.0, seed=0)
    oracle = summarise(simulate(sessions, SimSpec(replicas=4, policy="oracle", stub=FAST)))
    rr = summarise(simulate(sessions, SimSpec(replicas=4, policy="round_robin", stub=FAST)))
    assert oracle.errors == rr.errors == 0
    assert oracle.ttft_p90_s < 0.8 * rr.ttft_p90_s, (oracle.ttft_p90_s, rr.ttft_p90_s)


def test_simulate_runs_the_oracle_by_name(tmp_path: Path) -> None:
    args = "simulate -w tenant-bursts -p waves=2 --policies oracle,round_robin --speedup 10 --no-plots -q"
    assert main([*args.split(), "--out", str(tmp_path)]) == 0
    runs = orjson.loads((tmp_path / "result.json").read_bytes())["runs"]
    assert set(runs) == {"oracle", "round_robin"}
    assert runs["oracle"]["requests"] == runs["round_robin"]["requests"] > 0


def test_outside_the_simulator_it_refuses() -> None:
    view = RequestView("r", "chat", "m", False, {"messages": []}, b"")
    with pytest.raises(RuntimeError, match="only inside the simulator"):
        OraclePolicy().choose(view, [Candidate("a")])
