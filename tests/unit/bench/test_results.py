"""The published benchmark tables are what their commands render, not hand edits.

Every docs/benchmarks/results/NAME.json is rendered again with the `render` function of the command
that wrote it (bench/results.py); the committed NAME.md must equal that rendering byte for byte. A
table edited by hand, or a renderer changed without rerunning (or re-rendering) its results, fails.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bench import results

PUBLISHED = sorted(results.RESULTS.glob("*.json"))
DOCS = results.RESULTS.parent


@pytest.mark.timeout(30)
@pytest.mark.parametrize("path", PUBLISHED, ids=[p.stem for p in PUBLISHED])
def test_the_published_markdown_is_the_command_s_rendering_of_its_json(path: Path) -> None:
    published = orjson.loads(path.read_bytes())
    assert {"module", "command", "machine", "date", "note", "figures"} <= published.keys()
    markdown = path.with_suffix(".md")
    assert markdown.exists(), f"{markdown.name} is missing: rerun the command with --results {path.stem}"
    expected = results.fragment(published, results.renderer(published))
    assert markdown.read_text() == expected, (
        f"{markdown.name} differs from the rendering of {path.name}: rerun the command, or after a renderer "
        "change `python -m bench.results`; never edit it by hand"
    )


@pytest.mark.timeout(30)
def test_every_published_table_is_included_by_a_page() -> None:
    pages = "".join(page.read_text() for page in DOCS.glob("*.md"))
    for path in PUBLISHED:
        # the whole file, or one of its sections (`NAME.md:aims`)
        assert f'--8<-- "benchmarks/results/{path.stem}.md' in pages, f"no benchmarks page includes {path.stem}.md"


@pytest.mark.timeout(30)
def test_a_hand_edited_table_is_caught(tmp_path: Path) -> None:
    published = results.load("matrix-8")
    assert published is not None
    render = results.renderer(published)
    results.write("edited", published, render, folder=tmp_path)
    edited = tmp_path / "edited.md"
    edited.write_text(edited.read_text().replace("| 0.88 |", "| 0.98 |", 1))
    assert edited.read_text() != results.fragment(published, render)
