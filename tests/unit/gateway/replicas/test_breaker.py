"""The circuit breaker's state machine, on explicit clock values."""

from __future__ import annotations

from gateway.replicas.breaker import CircuitBreaker


def fault(b: CircuitBreaker, now: float) -> bool:
    """3 faults in 10 s open it; backoff 1 s, doubling, capped at 3 s."""
    return b.fault(now, threshold=3, window_s=10.0, backoff_s=1.0, backoff_max_s=3.0)


def test_opens_after_n_faults_within_the_window_only() -> None:
    b = CircuitBreaker()
    assert not fault(b, 0.0) and not fault(b, 5.0)
    assert not fault(b, 11.0), "the fault at t=0 fell out of the window"
    assert fault(b, 12.0)
    assert b.state(12.5) == "open" and not b.allows(12.5)
    assert not fault(b, 12.6), "faults of requests started before the opening change nothing"
    assert b.open_until == 13.0


def test_half_open_admits_one_trial_whose_verdict_closes_or_reopens_with_doubled_backoff() -> None:
    b = CircuitBreaker()
    for t in (0.0, 0.1, 0.2):
        fault(b, t)
    assert b.state(1.3) == "half_open" and b.allows(1.3)
    assert b.dispatched(1.3) and not b.allows(1.3) and not b.dispatched(1.3)
    assert fault(b, 1.4), "a failed trial reopens at once"
    assert b.open_until == 1.4 + 2.0 and b.opened_total == 2
    assert b.dispatched(3.5)
    assert fault(b, 3.6) and b.open_until == 3.6 + 3.0, "backoff is capped"
    b.dispatched(7.0)
    b.success(7.1)
    assert b.state(7.1) == "closed" and b.openings == 0 and b.allows(7.1)


def test_success_while_closed_does_not_forgive_recent_faults() -> None:
    b = CircuitBreaker()
    fault(b, 0.0)
    fault(b, 0.1)
    b.success(0.2)
    assert fault(b, 0.3), "a replica failing every other request still opens"


def test_client_cancelled_trial_frees_the_slot() -> None:
    b = CircuitBreaker()
    for t in (0.0, 0.1, 0.2):
        fault(b, t)
    assert b.dispatched(2.0)
    b.end_trial()
    assert b.allows(2.0) and b.state(2.0) == "half_open"
