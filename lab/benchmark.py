"""What `affinity-gateway bench` and `simulate` do: run a seeded workload (against a URL, against
a fresh local cluster per policy, or in the simulator), show live progress, and write
`result.json`, `table.md` and the plots into one directory, in the same format either way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gateway import __version__
from lab import loadgen, peers, replica_counts
from lab.cluster import ClusterSpec, free_port, started
from lab.results import Result, Summary, summarise, table
from lab.sim_spec import SimSpec
from lab.simulate import Simulation
from lab.workloads import Session, num_requests

Runs = dict[str, tuple[Summary, list[Result]]]
console = Console(stderr=True)


@contextmanager
def progress(label: str, total: int, enabled: bool = True) -> Iterator[Callable[[Result], None]]:
    """A live bar with done/total, errors, running TTFT p50 and cache hits; yields the per-result hook."""
    seen: list[Result] = []
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[stats]}"),
        console=console,
        disable=not enabled,
        refresh_per_second=4,
    ) as bar:
        task = bar.add_task(label, total=total, stats="")

        def on_result(result: Result) -> None:
            seen.append(result)
            if len(seen) % max(1, total // 200) and len(seen) != total:
                return  # redraw the stats ~200 times per run, not per request
            ttfts = sorted(r.ttft_s for r in seen[-500:] if r.ttft_s is not None)
            prompt = sum(r.prompt_tokens for r in seen) or 1
            stats = (
                f"errors {sum(not r.ok for r in seen)}  TTFT p50 {ttfts[len(ttfts) // 2] if ttfts else 0:.3f}s  "
                f"cached {sum(r.cached_tokens for r in seen) / prompt:.2f}"
            )
            bar.update(task, completed=len(seen), stats=stats)

        yield on_result


def target_rate(sessions: list[Session], concurrency: int) -> float:
    """Sessions per second the workload's start times ask for (0 in closed-loop mode)."""
    if concurrency or len(sessions) < 2:
        return 0.0
    starts = sorted(s.start_s for s in sessions)
    return (len(starts) - 1) / (starts[-1] - starts[0]) if starts[-1] > starts[0] else 0.0


def bench_url(
    url: str,
    model: str,
    sessions: list[Session],
    *,
    concurrency: int = 0,
    ignore_eos: bool = True,
    timeout_s: float = 300.0,
    label: str = "bench",
    show: bool = True,
    replicas: list[str] | None = None,
) -> tuple[Summary, list[Result]]:
    """`replicas`: the pool's replica names when known, so one that served nothing shows as 0."""
    with progress(label, num_requests(sessions), show) as on_result:
        results = asyncio.run(
            loadgen.run(
                url,
                model,
                sessions,
                concurrency=concurrency,
                ignore_eos=ignore_eos,
                timeout_s=timeout_s,
                on_result=on_result,
            )
        )
    return summarise(results, target_session_rate=target_rate(sessions, concurrency), replicas=replicas), results


def bench_compare(
    contestants: list[str],
    sessions: list[Session],
    cluster: ClusterSpec,
    *,
    concurrency: int = 0,
    timeout_s: float = 300.0,
    show: bool = True,
    evidence: list[str] | tuple[str, ...] = ("history",),
    policy_params: dict[str, dict[str, Any]] | None = None,
    labels: dict[str, dict[str, str]] | None = None,
) -> Runs:
    """One fresh cluster (replicas + a router) per contestant, the same sessions against each. A
    contestant is one of our policies (run once per `evidence`, with its `policy_params`) or a peer
    router, `peer:policy` (`lab.peers`). `labels` receives each run's router, version and policy."""
    runs: Runs = {}
    names = [f"replica-{i}" for i in range(cluster.replicas)]
    entries = [peers.contestant(name) for name in contestants]  # all parsed before the first run
    if cluster.engine != "sim" and any(e.peer is peers.ORACLE for e in entries):
        raise ValueError("the oracle routes by the sim stubs' own forecasts: it needs --engine sim")
    for entry in entries:
        sources = evidence if entry.peer is None else ("history",)
        for source in sources:
            name = entry.name if entry.peer is not None else run_name(entry.policy, source)
            spec = dataclasses.replace(
                cluster,
                policy=entry.policy,
                port=free_port(),
                peer=entry.peer,
                kv_events=source == "events" and entry.peer is None,
                policy_params={} if entry.peer else (policy_params or {}).get(entry.policy, {}),
            )
            with started(spec) as running:
                before = replica_counts.finished(running.replicas)
                summary, results = bench_url(
                    running.urls[0],
                    spec.model,
                    sessions,
                    concurrency=concurrency,
                    timeout_s=timeout_s,
                    label=name,
                    show=show,
                    replicas=names,
                )
                if not sum(summary.replica_share.values()):  # no answer named its replica: ask the replicas
                    summary.replica_share = (
                        replica_counts.served(names, before, replica_counts.finished(running.replicas))
                        or summary.replica_share
                    )
                runs[name] = (summary, results)
            if labels is not None:
                peer = entry.peer
                labels[name] = {
                    "router": peer.package if peer else "affinity-gateway",
                    "version": peer.version if peer else __version__,
                    "policy": entry.policy,
                }
    return runs


def run_name(policy: str, evidence: str) -> str:
    return policy if evidence == "history" else f"{policy}+events"


def simulate_policies(
    policies: list[str],
    sessions: list[Session],
    spec: SimSpec,
    policy_params: dict[str, dict[str, Any]] | None = None,
    show: bool = True,
    effective: dict[str, Any] | None = None,
    evidence: tuple[str, ...] | list[str] = ("history",),
) -> Runs:
    """`policy_params`: per policy name, its routing params (the policy's defaults otherwise).
    `effective` receives every policy's full parameters as run (defaults included), for the record.
    `evidence`: "history" and/or "events" (KV events); an events run is named `<policy>+events`."""
    effective = {} if effective is None else effective
    runs: Runs = {}
    names = [f"replica-{i}" for i in range(spec.replicas)]
    for policy in policies:
        params = (policy_params or {}).get(policy, {})
        for source in evidence:
            name = run_name(policy, source)
            started_at = time.perf_counter()
            simulation = Simulation(
                dataclasses.replace(spec, policy=policy, policy_params=params, kv_events=source == "events"),
                on_result=None,
            )
            effective[policy] = simulation.router.policy.params.model_dump()
            with progress(name, num_requests(sessions), show) as on_result:
                simulation.on_result = on_result
                results = simulation.run(sessions)
            summary = summarise(results, target_session_rate=target_rate(sessions, spec.concurrency), replicas=names)
            console.print(f"{name}: {len(results)} requests simulated in {time.perf_counter() - started_at:.1f} s")
            runs[name] = (summary, results)
    return runs


def write_outputs(out_dir: Path, runs: Runs, meta: dict[str, Any], plots: bool = True) -> Path:
    """result.json (meta + one summary per run), table.md and, with `plots`, the PNGs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = {name: summary for name, (summary, _) in runs.items()}
    result = {"meta": meta, "runs": {name: s.to_dict() for name, s in summaries.items()}}
    (out_dir / "result.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    (out_dir / "table.md").write_text(table(summaries) + "\n")
    if plots:
        try:
            from lab.plots import write_plots  # matplotlib is the optional `bench` extra
        except ImportError:
            console.print("plots skipped: matplotlib is not installed (pip install 'affinity-gateway[bench]')")
        else:
            write_plots(out_dir, runs, f"{meta.get('workload', '')} ({meta.get('mode', '')})")
    return out_dir / "result.json"
