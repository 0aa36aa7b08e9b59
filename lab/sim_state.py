"""The simulator's records (`lab.simulate`): one replica's state as the simulation keeps it, a fast-forwarded
run of decode steps, a session in flight. Apart from `Simulation` so the lab's oracle (`lab.oracle`) can read a
replica's true state without importing the simulation that drives it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from gateway.view import RequestView
from lab.results import Result
from lab.workloads import Session
from replica_stub.request import Request
from replica_stub.scheduler import Scheduler, SchedulerOutput


@dataclass(slots=True)
class SimReplica:
    name: str
    scheduler: Scheduler
    in_flight: int = 0
    running: int = 0  # as last scraped
    waiting: int = 0
    kv_usage: float = 0.0
    busy: bool = False
    # The step in flight while busy, for what reads the replica's true state (`lab.oracle`): when it ends,
    # and either the scheduled step (not yet applied to the scheduler) or the fast-forwarded decode run.
    busy_until: float = 0.0
    step: SchedulerOutput | None = None
    run: DecodeRun | None = None


@dataclass(slots=True)
class DecodeRun:
    """Plain decode steps of one replica, fast-forwarded (`Scheduler.decode_only_steps`): each step
    still has its own event at its own time, but the scheduler is only brought up to date (tokens,
    inter-token gaps) when the run ends."""

    requests: list[Request]
    contexts: list[int]  # each request's context in the run's first step
    steps: int  # at most this many
    times: list[float]  # when the run started, then when each step ended


@dataclass(slots=True)
class Active:
    """A session in flight: its history so far, in stub tokens and in chat messages."""

    session: Session
    turn: int
    messages: list[dict[str, str]]
    token_ids: list[int]
    answer_rng: random.Random
    view: RequestView | None = None
    replica: SimReplica | None = None
    request: Request | None = None  # the one in flight
    result: Result | None = None
    last_token_s: float = 0.0
    answer_ids: list[int] = field(default_factory=list)
