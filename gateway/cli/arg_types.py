"""argparse types shared by the gateway's commands and the lab's (`up` takes `--workers` too)."""

from __future__ import annotations

import argparse


def workers_arg(text: str) -> int:
    """argparse type of --workers: an integer >= 1 (argparse names the option in its error)."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {count}")
    return count
