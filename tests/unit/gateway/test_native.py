"""The compiled hot path (gateway.native): the suite runs on the build, never on a stale one."""

from __future__ import annotations

import importlib.machinery
import os
import shutil
from pathlib import Path

import pytest

from gateway import native


def test_the_suite_runs_every_hot_module_compiled() -> None:
    # `make test` builds first (`make native`) wherever there is a C compiler: the suite tests the code the
    # gateway runs, not its interpreted twin.
    if shutil.which("cc") is None:
        pytest.skip("no C compiler: the gateway and the suite run the hot path interpreted")
    running = native.compiled()
    assert len(running) == len(native.HOT_MODULES), f"compiled: {running}"


def test_a_build_older_than_any_source_of_the_package_is_stale(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    hot, other = package / "sub" / "hot.py", package / "other.py"
    hot.write_text("")
    other.write_text("")
    built = package / "sub" / f"hot{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    built.write_bytes(b"")
    os.utime(hot, (100, 100))
    os.utime(other, (100, 100))
    os.utime(built, (200, 200))
    assert native.stale(package, ("pkg/sub/hot.py",)) == []
    os.utime(other, (300, 300))  # not the compiled module itself: what it calls may have changed
    assert native.stale(package, ("pkg/sub/hot.py",)) == ["pkg/sub/hot.py"]
    built.unlink()  # nothing built: nothing stale, the module runs interpreted
    assert native.stale(package, ("pkg/sub/hot.py",)) == []
