"""The request event's own JSON renderer writes what structlog's chain would, key for key."""

from __future__ import annotations

import datetime
import io
import sys
from collections.abc import Callable, Iterator

import orjson
import pytest
import structlog

from gateway.log import HotLogger, iso_utc, lines_together, setup_logging

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def capture_stderr(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], io.BytesIO]]:
    """Call it in the test itself: pytest's own capture sets `sys.stderr` again between set-up and the call."""
    wrappers: list[io.TextIOWrapper] = []

    def capture() -> io.BytesIO:
        raw = io.BytesIO()
        wrappers.append(io.TextIOWrapper(raw, write_through=True))  # held: collecting it would close `raw`
        monkeypatch.setattr(sys, "stderr", wrappers[-1])
        return raw

    yield capture
    structlog.reset_defaults()
    for wrapper in wrappers:
        wrapper.detach()


def _lines(raw: io.BytesIO) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in raw.getvalue().splitlines()]


def test_the_fast_line_has_the_chains_keys_in_the_chains_order(capture_stderr: Callable[[], io.BytesIO]) -> None:
    captured_stderr = capture_stderr()
    setup_logging("info", "json")
    fields = {"request_id": "r-1", "status": 200, "decision": [{"replica": "r0"}], "error": None}
    with structlog.contextvars.bound_contextvars(trace_id="abc", worker=1):
        HotLogger("gateway.request").event("request", dict(fields))
        structlog.get_logger("gateway.request").info("request", **fields)
    fast, chain = _lines(captured_stderr)
    assert list(fast) == list(chain)
    assert {k: v for k, v in fast.items() if k != "timestamp"} == {k: v for k, v in chain.items() if k != "timestamp"}
    assert fast["trace_id"] == "abc" and fast["level"] == "info"


def test_info_events_below_the_level_are_not_written(capture_stderr: Callable[[], io.BytesIO]) -> None:
    captured_stderr = capture_stderr()
    setup_logging("warning", "json")
    HotLogger("gateway.request").info("request", request_id="r-1")
    assert captured_stderr.getvalue() == b""


def test_under_another_configuration_the_event_goes_through_structlog(
    capture_stderr: Callable[[], io.BytesIO],
) -> None:
    capture_stderr()
    setup_logging("info", "json")
    with structlog.testing.capture_logs() as logs:
        HotLogger("gateway.request").info("request", request_id="r-1")
    assert logs == [{"event": "request", "request_id": "r-1", "log_level": "info"}]


@pytest.mark.parametrize("now", [1765000000.0, 1765000000.5, 1765000000.123456, 1765003599.999999])
def test_timestamps_read_as_timestampers(now: float) -> None:
    stamped = datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat().replace("+00:00", "Z")
    assert iso_utc(now)[:19] == stamped[:19] and iso_utc(now).endswith("Z")
    assert abs(datetime.datetime.fromisoformat(iso_utc(now)).timestamp() - now) < 2e-6


def test_lines_held_together_are_written_in_one_write_in_their_order(
    capture_stderr: Callable[[], io.BytesIO], monkeypatch: pytest.MonkeyPatch
) -> None:
    captured_stderr = capture_stderr()
    setup_logging("info", "json")
    writes: list[bytes] = []
    stream = sys.stderr.buffer
    original = stream.write
    monkeypatch.setattr(stream, "write", lambda data: writes.append(bytes(data)) or original(data))
    logger = HotLogger("gateway.request")
    with lines_together():
        for request_id in ("r-1", "r-2", "r-3"):
            logger.event("request", {"request_id": request_id})
        assert captured_stderr.getvalue() == b""  # held until the block ends
    logger.event("request", {"request_id": "r-4"})  # after it: written at once again
    assert len(writes) == 2
    assert [line["request_id"] for line in _lines(captured_stderr)] == ["r-1", "r-2", "r-3", "r-4"]
