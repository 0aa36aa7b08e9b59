"""Error messages with the replicas hidden (`headers.replica_id: false`): names, URLs and anything shaped
like a network address read `(hidden)`; the rest of the message stays as it was."""

from __future__ import annotations

import pytest

from gateway.errors import HIDDEN, UpstreamError, without_replicas

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("message", "names", "expected"),
    [
        ("replica 127.0.0.1:8001 failed: ClientOSError", (), f"replica {HIDDEN} failed: ClientOSError"),
        (
            "replica gpu-a broke off its answer",
            ("gpu-a", "http://10.0.0.5:8000"),
            f"replica {HIDDEN} broke off its answer",
        ),
        ("connect to http://vllm-0.vllm.svc:8000/v1 refused", (), f"connect to {HIDDEN} refused"),
        ("replica [fd00::5]:8000 timed out", (), f"replica {HIDDEN} timed out"),
        ("host 10.1.2.3 unreachable", (), f"host {HIDDEN} unreachable"),
        ("no healthy replica for model 'm' (last: x)", (), "no healthy replica for model 'm' (last: x)"),
        ("answer over limits.max_answer_bytes (67108864)", (), "answer over limits.max_answer_bytes (67108864)"),
    ],
)
def test_without_replicas(message: str, names: tuple[str, ...], expected: str) -> None:
    assert without_replicas(message, names) == expected


def test_the_body_hides_only_when_asked() -> None:
    error = UpstreamError("replica 127.0.0.1:9 failed")
    assert b"127.0.0.1:9" in error.body()
    assert b"127.0.0.1" not in error.body(hide=()) and b'"code":502' in error.body(hide=())
