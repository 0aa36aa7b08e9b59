"""structlog set-up: one JSON object per line on stderr (orjson), or a readable console form for humans."""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

import orjson
import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


@dataclass(frozen=True)
class _JsonLines:
    """What `setup_logging` configured for JSON: its processor list (the identity `HotLogger` checks), the
    stream, and whether info events pass its level."""

    processors: list[Any]
    renderer: Any  # its last: `capture_logs` swaps the list's contents in place, keeping the list
    stream: IO[bytes]
    info_enabled: bool


_json_lines: _JsonLines | None = None


def setup_logging(level: str = "info", fmt: str = "json") -> None:
    """Idempotent; a reload calls it again with the new level."""
    global _json_lines
    json = fmt == "json"
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(serializer=orjson.dumps)
        if json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        renderer,
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=(
            structlog.BytesLoggerFactory(sys.stderr.buffer) if json else structlog.PrintLoggerFactory(sys.stderr)
        ),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(_LEVELS[level], logging.WARNING), stream=sys.stderr)
    _json_lines = _JsonLines(processors, renderer, sys.stderr.buffer, _LEVELS[level] <= logging.INFO) if json else None


class HotLogger:
    """For an event written on every request. Under `setup_logging`'s own JSON configuration it renders
    the line itself: the same keys in the same order as the processor chain (the event's fields, `event`,
    the bound context vars, `level`, `timestamp`), a quarter of the chain's cost. Under any other
    configuration (console format, tests' `capture_logs`) it goes through structlog, with its logger bound
    once per configuration: through the lazy proxy every call binds a fresh logger first, and caching on
    first use would miss a reload's new level."""

    __slots__ = ("_name", "_config", "_bound")

    def __init__(self, name: str) -> None:
        self._name = name
        self._config: tuple[Any, ...] = ()
        self._bound: Any = None

    def info(self, event: str, **fields: Any) -> None:
        self.event(event, fields)

    def event(self, event: str, fields: dict[str, Any]) -> None:
        """`info(event, **fields)` for a caller that has built the dict already (it is written into)."""
        config = structlog.get_config()
        fast = _json_lines
        processors = config["processors"]
        if fast is not None and processors is fast.processors and processors[-1] is fast.renderer:
            if fast.info_enabled:
                _write_line(fast.stream, event, fields)
            return
        key = (processors, config["wrapper_class"], config["logger_factory"])
        if key != self._config:
            self._bound, self._config = structlog.get_logger(self._name).bind(), key
        self._bound.info(event, **fields)


_PREFIX = structlog.contextvars.STRUCTLOG_KEY_PREFIX
_second: list[Any] = [-1, ""]  # the last whole second stamped, and its "YYYY-MM-DDTHH:MM:SS"


def _write_line(stream: IO[bytes], event: str, fields: dict[str, Any]) -> None:
    """One info event as `setup_logging`'s JSON chain renders it (merge_contextvars, add_log_level,
    TimeStamper(iso, utc), JSONRenderer(orjson)), written and flushed as structlog's BytesLogger does."""
    fields["event"] = event
    for var, value in contextvars.copy_context().items():
        if value is not Ellipsis and var.name.startswith(_PREFIX):
            fields.setdefault(var.name[len(_PREFIX) :], value)
    fields["level"] = "info"
    fields["timestamp"] = iso_utc(time.time())
    line = orjson.dumps(fields, option=orjson.OPT_APPEND_NEWLINE)
    if _together is not None:
        _together.append(line)
        return
    stream.write(line)
    stream.flush()


_together: list[bytes] | None = None  # lines held by `lines_together`


@contextmanager
def lines_together() -> Iterator[None]:
    """Hot events' lines (`HotLogger` under the JSON configuration) written in one write when the block
    ends, not one write and flush each: for a batch of finished requests' log events. Other events are
    written as they come, so one may land before lines held here."""
    global _together
    if _together is not None or _json_lines is None:  # nested, or no JSON lines to hold
        yield
        return
    held: list[bytes] = []
    _together = held
    try:
        yield
    finally:
        _together = None
        if held:
            _json_lines.stream.write(b"".join(held))
            _json_lines.stream.flush()


def iso_utc(now: float) -> str:
    """`datetime.now(timezone.utc).isoformat()` with `Z` for `+00:00`, as TimeStamper writes it, at a fifth of
    its cost: the date and time of day are formatted once a second."""
    second = int(now)
    if second != _second[0]:
        _second[:] = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    micros = int((now - second) * 1e6)
    return f"{_second[1]}.{micros:06d}Z" if micros else f"{_second[1]}Z"
