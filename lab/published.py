"""What `affinity-gateway bench` and `simulate` add to a run's own table: the median rows of
`--rounds N`, and `--results NAME`, the table published where the benchmark pages include it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lab.results import median_of, table

CHECKOUT = Path(__file__).resolve().parent.parent  # the project's checkout, for an editable install


def with_medians(rounds: list[Any]) -> dict[str, Any]:
    """Every round's runs (`name #k`), then each contestant's median row (`name: median of N`), which holds
    no requests of its own (its plots are the rounds')."""
    runs = {f"{name} #{k}": run for k, got in enumerate(rounds, 1) for name, run in got.items()}
    for name in rounds[0]:
        runs[f"{name}: median of {len(rounds)}"] = (median_of([got[name][0] for got in rounds]), [])
    return runs


def publish(name: str, summaries: dict[str, Any], meta: dict[str, Any], argv: list[str]) -> None:
    """`--results NAME`: the run's table as the benchmark pages include it. `bench.results` lives in the
    project's checkout, not in the installed package: it is found beside this package (an editable
    install), or not at all."""
    if (CHECKOUT / "bench" / "results.py").exists() and str(CHECKOUT) not in sys.path:
        sys.path.append(str(CHECKOUT))
    try:
        from bench import results
    except ImportError:
        print("affinity-gateway: --results publishes into a checkout of the project (its bench/ and docs/)")
        return
    figures = {"runs": summaries, "meta": meta}
    published = results.record(__name__, figures, argv, program="affinity-gateway")
    print(results.write(name, published, render, folder=results.RESULTS))


def render(figures: dict[str, Any]) -> str:
    """The published table of a `bench` or `simulate` run, from its summaries; a run transcribed from an
    earlier page may lack figures that page did not show, and they read "-"."""
    return table(figures["runs"])
