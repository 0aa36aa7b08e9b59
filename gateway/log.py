"""structlog set-up: one JSON object per line on stderr (orjson), or a readable console form for humans."""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson
import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def setup_logging(level: str = "info", fmt: str = "json") -> None:
    """Idempotent; a reload calls it again with the new level."""
    json = fmt == "json"
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(serializer=orjson.dumps)
        if json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=(
            structlog.BytesLoggerFactory(sys.stderr.buffer) if json else structlog.PrintLoggerFactory(sys.stderr)
        ),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(_LEVELS[level], logging.WARNING), stream=sys.stderr)


class HotLogger:
    """For an event written on every request: its logger is bound once per structlog configuration. Through
    structlog's lazy proxy every call binds a fresh logger first (a fifth of the call); caching on first use
    would miss a reload's new level, and tests' `capture_logs`."""

    __slots__ = ("_name", "_config", "_bound")

    def __init__(self, name: str) -> None:
        self._name = name
        self._config: tuple[Any, ...] = ()
        self._bound: Any = None

    def info(self, event: str, **fields: Any) -> None:
        config = structlog.get_config()
        key = (config["processors"], config["wrapper_class"], config["logger_factory"])
        if key != self._config:
            self._bound, self._config = structlog.get_logger(self._name).bind(), key
        self._bound.info(event, **fields)
