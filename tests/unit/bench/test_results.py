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


# The README's and the overview's headline table: the high-load cells of the published head-to-head.
HEADLINE_COLUMNS = ("prefix_affinity", "sglang:cache_aware", "smg:cache_aware", "vllm-router:consistent_hash")
HEADLINE_COLUMNS += ("round_robin",)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("page", [DOCS.parent.parent / "README.md", DOCS / "index.md"], ids=["README", "overview"])
def test_the_headline_table_quotes_the_published_head_to_head(page: Path) -> None:
    """A rerun of the peers matrix changes results/peers.md; the hand-written headline copies must follow."""
    published = results.load("peers")
    assert published is not None
    high = {cell["family"]: cell["runs"] for cell in published["figures"]["cells"] if cell["load"] == "high"}
    lines = page.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| workload | prefix_affinity |"))
    after = lines[start + 2 :]
    rows = after[: next((i for i, line in enumerate(after) if not line.startswith("| ")), len(after))]
    assert {row.split("|")[1].split()[0] for row in rows} == set(high)
    for row in rows:
        cells = [c.strip().strip("*") for c in row.strip("|").split("|")]
        figures = high[cells[0].split()[0]]
        quoted = [f"{figures[name]['ttft_p90_ms']:.0f}" for name in HEADLINE_COLUMNS]
        assert cells[1:] == quoted, f"{page.name}: {cells[0]} quotes {cells[1:]}, the published run has {quoted}"
