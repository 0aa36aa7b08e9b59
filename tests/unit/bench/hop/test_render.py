"""The hop table's ratios: against the bare proxy and SMG, "-" for a reference that did not run."""

from __future__ import annotations

import pytest

from bench.hop.__main__ import render


@pytest.mark.timeout(10)
def test_a_ratio_to_a_contestant_that_did_not_run_is_a_dash_not_nan() -> None:
    cell = {"rates": [1000.0, 1200.0], "cpu_ms_per_request": 0.5, "p99_ms": 10.0, "failed": 0}
    bare = {**cell, "rates": [2000.0, 2400.0], "cpu_ms_per_request": 0.25}
    figures = {"rounds": 2, "threads": 2, "connections": 64, "seconds": 5.0, "python": "3.11"}
    table = render({**figures, "cells": {"whole": {"bare": bare, "ours:round_robin": cell}}})
    row = next(line for line in table.splitlines() if "ours:round_robin" in line)
    assert "| 1,100 | 0.50 | - | 0.500 | 2.00 |" in row and "nan" not in table
