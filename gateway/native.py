"""The hot path compiled with mypyc: modules every proxied request runs through, built as C extensions
beside their sources.

Python imports an extension module before a `.py` of the same name, so once built the same code runs
compiled: the same decisions (`bench.simulator_fingerprint` is unchanged), less CPU per request
(docs/benchmarks/hop.md). Where nothing was built (no C compiler, a platform without wheels) the gateway
runs the same modules interpreted.

    python -m gateway.native           # build in place (`make install` does, and the image's build)
    python -m gateway.native --check   # exit 1 if a build is older than a source of the package

A compiled module holds its type hints to their word at run time (a float where an `int` is declared
raises TypeError), so the test suite runs on the compiled build, never on a stale one (a build older than
any source of the package may disagree with what it calls): tests/conftest.py builds it again first.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import os
import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
GROUP = "gateway.compiled"  # mypyc's shared library of the group, beside this file

HOT_MODULES = (
    "gateway/routing/policies/prefix_affinity.py",
    "gateway/routing/policies/decayed.py",
    "gateway/routing/policies/conversations.py",
    "gateway/routing/policies/bound.py",
    "gateway/routing/policies/cost.py",
    "gateway/request/usage.py",
    "gateway/relay/sse_usage.py",
    "gateway/relay/headers.py",
    "gateway/request/timing.py",
    "gateway/request/decision.py",
    "gateway/prompt/prefix_keys.py",
    "gateway/log.py",
)


def _extension(source: Path) -> Path | None:
    """The built extension of `source`, if there is one."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        built = source.with_suffix(suffix)
        if built.exists():
            return built
    return None


def compiled() -> list[str]:
    """The hot modules this process runs compiled (each is imported, if it was not yet)."""
    names = [module.removesuffix(".py").replace("/", ".") for module in HOT_MODULES]
    return [name for name in names if _is_extension(importlib.import_module(name).__file__)]


def _is_extension(path: str | None) -> bool:
    return path is not None and path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def stale(package: Path = PACKAGE, modules: tuple[str, ...] = HOT_MODULES) -> list[str]:
    """The `modules` (paths from `package`'s parent) whose build is older than the newest source of `package`."""
    newest = max(source.stat().st_mtime for source in package.rglob("*.py"))
    old = []
    for module in modules:
        extension = _extension(package.parent / module)
        if extension is not None and extension.stat().st_mtime < newest:
            old.append(module)
    return old


_CONCAT = re.compile(r"CPyBytes_Concat\(.*?CPy_AddTraceback\(\"([^\"]+)\", \"([^\"]+)\", (\d+)", re.DOTALL)


def leaking_concatenations(generated: Path) -> list[str]:
    """Where the C mypyc generated under `generated` concatenates bytes (`path:line (function)`). Its
    `CPyBytes_Concat` takes over the left operand's reference and never releases it (mypy 1.19, still so in
    1.20): each call leaks that operand, a log line or a stream's events per request."""
    return sorted(
        {
            f"{match[1]}:{match[3]} ({match[2]})"
            for source in generated.rglob("*.c")
            for match in _CONCAT.finditer(source.read_text())
        }
    )


def build() -> None:
    """Compile the hot modules in place, mypyc type-checking them first with the source tree's mypy
    configuration; its scratch files stay under build/native (the next build is faster)."""
    from mypyc.build import mypycify  # a build-time tool (mypy), not a run-time dependency
    from setuptools import setup  # type: ignore[import-untyped]  # (it ships no type information)

    root = PACKAGE.parent
    if not (root / "pyproject.toml").exists():
        raise SystemExit(f"{root} is not the project's source tree: build there, then copy the extensions")
    for old in PACKAGE.rglob("*.so"):  # a module taken off the list must not stay compiled, and stale
        old.unlink()
    os.chdir(root)  # mypyc names the modules by their paths from here
    scratch = root / "build" / "native"
    os.environ["MYPY_CACHE_DIR"] = str(scratch / "mypy-cache")  # not the type checker's own cache
    extensions = mypycify(list(HOT_MODULES), group_name=GROUP, opt_level="3", target_dir=str(scratch / "c"))
    if leaks := leaking_concatenations(scratch / "c"):
        raise SystemExit(
            "mypyc's `bytes + bytes` never releases its left operand (a leak on every call): write "
            f'b"".join((a, b)) instead, at {", ".join(leaks)}'
        )
    setup(
        name="affinity-gateway-native",
        ext_modules=extensions,
        script_args=[
            "--quiet",
            "build_ext",
            "--inplace",
            "--build-temp",
            f"{scratch}/objects",
            "--build-lib",
            f"{scratch}/lib",
        ],
    )
    for module in HOT_MODULES:  # current as of now, though an unchanged one was copied with its old time
        if (extension := _extension(root / module)) is not None:
            extension.touch()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.native", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a build is older than a source")
    args = parser.parse_args(argv)
    if args.check:
        if old := stale():
            print(f"stale compiled modules (run `make native`): {', '.join(old)}", file=sys.stderr)
            return 1
        return 0
    build()
    return 0


if __name__ == "__main__":
    sys.exit(main())
