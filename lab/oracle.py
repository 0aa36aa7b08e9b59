"""The lab's engine-aware oracle: route each request where its true predicted TTFT is lowest.

Not a product policy (no gateway can see this much): in `affinity-gateway simulate --policies oracle` the
simulation hands it each replica's true state — the scheduler's waiting line and running batch, the block
pool's cached blocks, the step in flight — and the sim engine's own step cost (`TimingModel`). For each
candidate it asks the engine's forecast (`replica_stub.engine.forecast`: the scheduler replayed forward
until the new request's prefill would be done). In front of live sim stubs the same forecast runs in each
stub and `lab.oracle_router` asks for it (`bench --compare oracle`).

It is a yardstick: how far prefix_affinity, which sees only what a gateway sees, is from the best a greedy
router could do with perfect knowledge, family by family. What it leaves out: KV-cache pressure
(preemption, eviction during the wait) and the requests that will arrive after this one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from gateway.config.schema import Section
from gateway.request.decision import Candidate, Decision, Score
from gateway.routing.policies.base import Policy
from gateway.view import RequestView
from lab.sim_state import SimReplica
from replica_stub.engine import forecast
from replica_stub.engine.simulated import SimEngine
from replica_stub.engine.timing import TimingModel
from replica_stub.request import chain_hashes


class OracleConfig(Section):
    """No parameters: the oracle is the engine's own arithmetic (a config model like every policy's
    parameters, for the run's record)."""

    seed: int = 0


class EngineState(Protocol):
    """What the oracle reads: the simulation (`lab.simulate.Simulation`) provides it."""

    @property
    def replicas(self) -> Mapping[str, SimReplica]: ...

    @property
    def engine(self) -> SimEngine: ...

    @property
    def routing_prompt(self) -> list[int]: ...

    def clock(self) -> float: ...


class OraclePolicy(Policy):
    type = "oracle"

    def __init__(self, params: OracleConfig | None = None) -> None:
        super().__init__(params or OracleConfig())
        self._state: EngineState | None = None

    def bind(self, state: EngineState) -> None:
        self._state = state

    def choose(self, view: RequestView, candidates: Sequence[Candidate]) -> Decision:
        state = self._state
        if state is None:
            raise RuntimeError(
                "this policy routes only inside the simulator (Simulation binds it); "
                "in front of live stubs: bench --compare oracle (lab.oracle_router)"
            )
        prompt, engine, now = state.routing_prompt, state.engine, state.clock()
        ttfts = []
        for c in candidates:
            replica = state.replicas[c.replica_id]
            ttfts.append(predicted_ttft_s(replica, prompt, now, engine.timing, engine.speedup))
        best = min(ttfts)
        # Ties (idle replicas that hold the same prefix): the one with the fewest requests in flight.
        pick = min((i for i, t in enumerate(ttfts) if t <= best + 1e-9), key=lambda i: candidates[i].in_flight)
        scores = tuple(Score(c.replica_id, t, load=c.load) for c, t in zip(candidates, ttfts))
        return Decision(candidates[pick].replica_id, "oracle", scores)


def predicted_ttft_s(replica: SimReplica, prompt: list[int], now: float, timing: TimingModel, speedup: float) -> float:
    """Seconds from `now` until a new request with `prompt` (stub tokens) sent to `replica` has its first
    token: the sim engine's own forecast (`replica_stub.engine.forecast`) on the simulation's record of it."""
    scheduler, run = replica.scheduler, replica.run
    return forecast.predicted_ttft_s(
        scheduler,
        chain_hashes(prompt, scheduler.kv.pool.block_size),
        len(prompt),
        now,
        timing,
        speedup,
        busy_until=replica.busy_until if replica.busy else None,
        step=replica.step,
        run_ids={r.request_id for r in run.requests} if run is not None else set(),
        run_steps=len(run.times) if run is not None else 0,
    )
