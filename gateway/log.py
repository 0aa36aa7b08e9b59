"""structlog set-up: one JSON object per line on stderr (orjson), or a readable console form for humans."""

from __future__ import annotations

import logging
import sys

import orjson
import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def setup_logging(level: str = "info", fmt: str = "json") -> None:
    """Idempotent; a reload calls it again with the new level."""
    json = fmt == "json"
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(serializer=orjson.dumps) if json
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
        logger_factory=(structlog.BytesLoggerFactory(sys.stderr.buffer) if json
                        else structlog.PrintLoggerFactory(sys.stderr)),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(_LEVELS[level], logging.WARNING), stream=sys.stderr)
