"""The fingerprint that speed-up commits quote is only worth quoting if the simulator repeats itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.simulator_fingerprint import fingerprint


@pytest.mark.timeout(60)
def test_the_same_cell_gives_the_same_digest_and_another_cell_another(tmp_path: Path) -> None:
    first = fingerprint("agent-loop", tmp_path / "one")
    assert first == fingerprint("agent-loop", tmp_path / "two")
    assert first != fingerprint("hot-tenant", tmp_path / "three")
