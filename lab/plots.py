"""PNG plots of a policy comparison (matplotlib, headless): TTFT CDF per run, cached-token
ratio per run, and each run's share of requests per replica."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from lab.results import Result, Summary  # noqa: E402

PLOTS = ("ttft_cdf.png", "cached_ratio.png", "load_share.png")


def write_plots(out_dir: Path, runs: dict[str, tuple[Summary, list[Result]]], title: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in PLOTS]

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, (_, results) in runs.items():
        ttfts = sorted(r.ttft_s for r in results if r.ok and r.ttft_s is not None)
        if ttfts:
            ax.plot(ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))], label=name)
    ax.set(xlabel="time to first token (s)", ylabel="fraction of requests", title=f"TTFT CDF — {title}")
    ax.set_xscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend()
    _save(fig, paths[0])

    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(runs)
    ax.bar(names, [runs[n][0].cached_ratio for n in names], color="tab:green")
    ax.set(ylabel="cached prompt tokens / prompt tokens", ylim=(0, 1), title=f"Cache hits — {title}")
    ax.tick_params(axis="x", rotation=20)
    _save(fig, paths[1])

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        share = runs[name][0].replica_share
        total = sum(share.values()) or 1
        ax.bar([x + i * width for x in range(len(share))], [v / total for v in share.values()], width, label=name)
    replicas = max((runs[n][0].replica_share for n in names), key=len, default={})
    if len(replicas) <= 16:
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(replicas))], list(replicas), rotation=45)
    ax.set(xlabel="replica", ylabel="share of requests", title=f"Load share — {title}")
    ax.legend(fontsize="small")
    _save(fig, paths[2])
    return paths


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
