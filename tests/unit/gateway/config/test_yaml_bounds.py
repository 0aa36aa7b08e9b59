"""YAML aliases cannot blow a small config file up: the expanded document is bounded before `${VAR}`
interpolation and the dataclasses walk it (a 1 KB file naming 10**8 leaves took 37 s and 2.39 GB)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.config.loader import load_config
from gateway.errors import ConfigError

pytestmark = pytest.mark.timeout(30)


def alias_bomb(levels: int = 8, width: int = 10) -> str:
    """`width ** levels` leaves in a few hundred bytes: each level a list of `width` aliases of the last."""
    lines = ["l0: &l0 [" + ", ".join(['"${HOME}"'] * width) + "]"]
    for n in range(1, levels + 1):
        lines.append(f"l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * width) + "]")
    return "\n".join(lines) + "\npools: {m: {replicas: [{url: 'http://127.0.0.1:1'}]}}\n"


def test_an_alias_bomb_is_refused_quickly_naming_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    assert len(path.read_bytes()) < 1024
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={"HOME": "/root"})
    took_s = time.monotonic() - started
    assert "alias" in str(caught.value) and str(path) in str(caught.value), str(caught.value)
    assert took_s < 1.0, f"took {took_s:.2f}s"


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text("x: &x [*x]\npools: {}\n")
    with pytest.raises(ConfigError, match="alias"):
        load_config(path, env={})


def test_ordinary_anchors_still_load(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text(
        "pools:\n"
        "  a: {replicas: [&r {url: 'http://127.0.0.1:1'}], routing: &routing {policy: round_robin}}\n"
        "  b: {replicas: [*r], routing: *routing}\n"
    )
    config = load_config(path, env={})
    assert config.pools["b"].replicas[0].url == "http://127.0.0.1:1"
