"""Published benchmark results as files, so the docs show what a command printed and not a hand-kept copy.

A command that publishes takes `--results NAME` and writes two files into docs/benchmarks/results/:
NAME.json, the run's figures with the command line, the machine and the date, and NAME.md, the
Markdown that the command's own `render` function makes of those figures (the same function that
prints the table on the terminal). The benchmark pages include NAME.md (pymdownx.snippets), and
tests/unit/bench/test_results.py renders every NAME.json again and compares, so a table edited by
hand, or a renderer changed without a rerun, fails the tests instead of drifting from its run.
`python -m bench.results` renders every NAME.md again from its NAME.json (after a renderer changed).
"""

from __future__ import annotations

import importlib
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "results"

Figures = dict[str, Any]
Renderer = Callable[[Figures], str]


def machine() -> str:
    """The machine in the words the pages use ("2 cores, 24 GiB, CPU only"): what a reader needs to
    judge the figures, and nothing that identifies the host."""
    memory_gib = 0.0
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    memory_gib = int(line.split()[1]) / 2**20
    except OSError:
        pass
    accelerator = "a GPU" if shutil.which("nvidia-smi") else "CPU only"
    return f"{os.cpu_count()} cores, {memory_gib:.0f} GiB, {accelerator}"


def now() -> str:
    """The run's date and time in UTC, to the minute: runs on one day are told apart by the hour."""
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def record(
    module: str, figures: Figures, argv: list[str] | None = None, note: str = "", program: str | None = None
) -> dict[str, Any]:
    """One run's results: the figures, the command that made them (`module` is also how the test finds
    the renderer; `program` names a command that is not `python -m <module>`, such as
    `affinity-gateway`), where and when. `note` says what a reader must know that the figures do not show."""
    args = sys.argv[1:] if argv is None else argv
    return {
        "module": module,
        "command": shlex.join([*(program.split() if program else ["python", "-m", module]), *args]),
        "machine": machine(),
        "date": now(),
        "note": note,
        "figures": figures,
    }


def header(results: dict[str, Any]) -> str:
    """The lines above every published table: command, machine, date, and the note if there is one."""
    lines = [f"Run {results['date']} on {results['machine']}:", "", "```sh", results["command"], "```"]
    if results.get("note"):
        lines += ["", '!!! note "About these figures"', "    " + results["note"]]
    return "\n".join(lines)


def fragment(results: dict[str, Any], render: Renderer) -> str:
    """The Markdown a page includes: the header (also on its own as the section `run`), then the command's
    own rendering of the figures."""
    return f"{section('run', header(results))}\n\n{render(results['figures'])}\n"


def section(name: str, text: str) -> str:
    """Text between pymdownx.snippets section markers: a page that wants one part of a results file
    includes `NAME.md:name`; a page that includes the whole file never sees the markers."""
    return f"--8<-- [start:{name}]\n{text}\n--8<-- [end:{name}]"


def plain(text: str) -> str:
    """The text without section markers, for the terminal."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("--8<-- ["))


def renderer(results: dict[str, Any]) -> Renderer:
    """The `render` function of the module that wrote these results (one renderer per command); a
    package run with `python -m` (bench.hop) keeps it in its __main__."""
    module = importlib.import_module(results["module"])
    if not hasattr(module, "render"):
        module = importlib.import_module(f"{results['module']}.__main__")
    render: Renderer = module.render
    return render


def load(name: str, folder: Path = RESULTS) -> dict[str, Any] | None:
    """The results published under NAME, or None: commands that add cells to a table (one workload at
    a time) read what is there first."""
    path = folder / f"{name}.json"
    return orjson.loads(path.read_bytes()) if path.exists() else None


def write(name: str, results: dict[str, Any], render: Renderer, folder: Path = RESULTS) -> Path:
    """Write NAME.json and NAME.md; the Markdown is rendered from the JSON just written, never from
    anything else, so the two cannot disagree."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2) + b"\n")
    markdown = folder / f"{name}.md"
    markdown.write_text(fragment(results, render))
    return markdown


def main() -> None:
    """Render every published NAME.md again from its NAME.json: after a change to a command's renderer,
    the pages follow without rerunning the benchmarks (the figures stay those of their runs)."""
    for path in sorted(RESULTS.glob("*.json")):
        published = orjson.loads(path.read_bytes())
        print(write(path.stem, published, renderer(published)))


if __name__ == "__main__":
    main()
