"""The hop benchmark: requests per second and CPU per request of every router in front of the same
three zero-delay replicas, driven by wrk (a compiled load generator, so the client is not the limit).

    python -m bench.hop [--seconds 6] [--rounds 2] [--connections 64] [--threads 2]
                        [--contestants direct,bare,ours:round_robin,ours:prefix_affinity,...]
                        [--modes whole,stream,tokens]

Contestants (in one run, interleaved in rounds so drift hits all alike):
- `direct`: wrk against one replica;
- `bare`: the reference contestant, a 30-line aiohttp proxy (`bench.hop.bare_proxy`), the floor;
- `ours:<policy>`: our gateway on its shipped defaults with that policy; `ours:<policy>+idle` adds
  tracing (sampling nothing), prices (token costs) and sessions and the prefix report (on by
  default) configured but exercised by no request; `…@N` runs `serve --workers N`;
- `base:<policy>`: the same from another source tree (`--baseline-tree`, e.g. a `git worktree` of an
  earlier commit), for a before/after ratio measured in one run;
- `sglang`, `smg` (their `cache_aware`, from `make peers`) and `nginx` (Debian's, round robin).
Modes: `whole` answers, `stream` (four SSE events arriving in one read: the relay's fixed cost per
request) and `tokens` (a stream of 32 events, each in its own write 2 ms apart, as an engine streams
tokens: the relay's cost per event; its requests per second are bounded by the gaps, its CPU per
request is the figure). Each request has a different prompt (`completions.lua`). CPU per request is
user + system time of the router's process tree from /proc over the wrk run, divided by the requests
it completed.
Client, replicas and routers share the machine's cores: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import results
from bench.hop.processes import cpu_seconds, running
from bench.hop.rig import fake_replicas, gateway_config, wrk
from lab import peers
from lab.cluster import free_port

MODES = {"whole": (False, 4), "stream": (True, 4), "tokens": (True, 32)}  # mode: (streamed, answer tokens)
CONTESTANTS = "direct,bare,ours:round_robin,ours:prefix_affinity,ours:prefix_affinity+idle,sglang,smg,nginx"
NGINX_CONF = """daemon off; worker_processes 1; pid {dir}/nginx.pid; error_log {dir}/error.log error;
events {{ worker_connections 4096; }}
http {{ access_log off; upstream replicas {{ {servers} keepalive 64; }}
  server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://replicas; proxy_http_version 1.1;
    proxy_set_header Connection ""; proxy_buffering off; }} }} }}
"""


@dataclass
class Cell:
    """One contestant in one mode: a requests/s figure per round, and the CPU it spent."""

    rates: list[float] = field(default_factory=list)
    requests: int = 0
    failed: int = 0
    cpu_s: float = 0.0
    p99_ms: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return statistics.mean(self.rates) if self.rates else float("nan")

    @property
    def cpu_ms_per_request(self) -> float:
        return self.cpu_s * 1e3 / self.requests if self.requests else float("nan")


def start(
    stack: ExitStack, name: str, replicas: list[str], workdir: Path, baseline: Path | None = None
) -> tuple[str, int | None] | str:
    """Start one contestant in front of the replicas: (its URL, the pid whose CPU counts), or why not."""
    if name == "direct":
        return replicas[0], None
    port = free_port()
    kind, _, spec = name.partition(":")
    if kind == "bare":
        args = [sys.executable, "-m", "bench.hop.bare_proxy", "--port", str(port)]
        pid = stack.enter_context(running([*args, *(a for r in replicas for a in ("--replica", r))], port))
    elif kind in ("ours", "base"):
        if kind == "base" and baseline is None:
            return "needs --baseline-tree"
        config = gateway_config(port, replicas, spec or "prefix_affinity", workdir)
        command = [sys.executable, "-m", "gateway", "serve", "--config", str(config)]
        # `-m` puts the working directory first on sys.path: the baseline's `gateway` is imported
        pid = stack.enter_context(running(command, port, cwd=baseline if kind == "base" else None))
    elif kind == "nginx":
        binary = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
        if binary is None:
            return "not installed (apt-get install nginx-light; `make peers` does)"
        servers = " ".join(f"server {r.removeprefix('http://')};" for r in replicas)
        conf = workdir / f"nginx-{port}.conf"
        conf.write_text(NGINX_CONF.format(dir=workdir, servers=servers, port=port))
        pid = stack.enter_context(running([binary, "-c", str(conf), "-p", str(workdir)], port))
    else:
        try:
            contestant = peers.contestant(f"{kind}:{spec or 'cache_aware'}")
        except ValueError as exc:
            return str(exc)
        assert contestant.peer is not None
        command = contestant.peer.command(contestant.policy, port, replicas, free_port())
        pid = stack.enter_context(running(command, port, env=peers.peer_env()))
    return f"http://127.0.0.1:{port}", pid


def measure(targets: dict[str, tuple[str, int | None]], args: argparse.Namespace) -> dict[str, dict[str, Cell]]:
    cells = {mode: {name: Cell() for name in targets} for mode in args.modes}
    for mode in args.modes:
        stream, tokens = MODES[mode]
        for url, _ in targets.values():  # warm connections, code paths and the peers' trees
            wrk(url, args.threads, args.connections, stream, 1, tokens)
    for _ in range(args.rounds):
        for mode in args.modes:
            stream, tokens = MODES[mode]
            for name, (url, pid) in targets.items():
                before = cpu_seconds(pid) if pid else 0.0
                requests, failed, seconds, p99 = wrk(url, args.threads, args.connections, stream, args.seconds, tokens)
                cell = cells[mode][name]
                cell.cpu_s += cpu_seconds(pid) - before if pid else 0.0
                cell.requests += requests
                cell.failed += failed
                cell.rates.append(requests / seconds)
                cell.p99_ms.append(p99)
    return cells


def summarize(cells: dict[str, dict[str, Cell]], args: argparse.Namespace) -> dict[str, Any]:
    """The published figures: the run's set-up, and per mode and contestant its requests/s per round,
    CPU ms per request (None for `direct`, which has no router), worst p99 and failed requests."""
    return {
        "threads": args.threads,
        "connections": args.connections,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "python": platform.python_version(),
        "cells": {
            mode: {
                name: {
                    "rates": cell.rates,
                    "cpu_ms_per_request": None if name == "direct" else cell.cpu_ms_per_request,
                    "p99_ms": max(cell.p99_ms),
                    "failed": cell.failed,
                }
                for name, cell in row.items()
            }
            for mode, row in cells.items()
        },
    }


def _ratio(rate: float, reference: float) -> str:
    """`rate` over a reference contestant's, "-" where that one did not run (or served nothing)."""
    return f"{rate / reference:.2f}" if reference > 0 else "-"


def render(figures: dict[str, Any]) -> str:
    """The table: rates per round and their mean, each against the bare proxy's and SMG's, CPU per request
    against the bare proxy's. p99 and failed are "-" where a run did not record them."""
    rounds = " | ".join(f"rps round {i + 1}" for i in range(figures["rounds"]))
    lines = [
        f"wrk -t{figures['threads']} -c{figures['connections']}, {figures['seconds']:g} s per run, "
        f"{figures['rounds']} rounds, 3 zero-delay replicas; Python {figures['python']}.",
        "",
        f"| mode | contestant | {rounds} | rps mean | / bare | / smg | CPU ms per request | / bare | p99 ms | failed |",
        "|---|---|" + "---|" * (figures["rounds"] + 7),
    ]
    nan = float("nan")
    for mode, row in figures["cells"].items():
        rate = {name: statistics.mean(cell["rates"]) if cell["rates"] else nan for name, cell in row.items()}
        bare_rate, smg_rate = rate.get("bare", nan), rate.get("smg", nan)
        bare_cpu = row["bare"]["cpu_ms_per_request"] if "bare" in row else None
        for name, cell in row.items():
            cpu = cell["cpu_ms_per_request"]
            lines.append(
                f"| {mode} | {name} | " + " | ".join(f"{r:,.0f}" for r in cell["rates"]) + f" | {rate[name]:,.0f} | "
                f"{_ratio(rate[name], bare_rate)} | {_ratio(rate[name], smg_rate)} | "
                + ("-" if cpu is None else f"{cpu:.3f}")
                + " | "
                + ("" if cpu is None or bare_cpu is None else f"{cpu / bare_cpu:.2f}")
                + " | "
                + ("-" if cell["p99_ms"] is None else f"{cell['p99_ms']:.1f}")
                + f" | {'-' if cell['failed'] is None else cell['failed']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hop", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="length of one wrk run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contestants", default=CONTESTANTS, help=f"comma-separated (default {CONTESTANTS})")
    parser.add_argument("--modes", default="whole,stream,tokens", help=f"some of {', '.join(MODES)}")
    parser.add_argument("--baseline-tree", type=Path, help="source tree the base:<policy> contestants run from")
    parser.add_argument("--results", metavar="NAME", help="also write docs/benchmarks/results/NAME.json and .md")
    args = parser.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    if not set(args.modes) <= set(MODES):
        parser.error(f"--modes: some of {', '.join(MODES)}")
    if shutil.which("wrk") is None:
        parser.error("wrk is not installed (apt-get install wrk; `make bench` does)")
    names = [n.strip() for n in args.contestants.split(",") if n.strip()]
    wants_peer = any(n.partition(":")[0] in peers.PEERS for n in names)
    if wants_peer and os.geteuid() == 0 and shutil.which("ip") and not peers.isolated():
        return peers.rerun_isolated(sys.argv[1:] if argv is None else argv, module="bench.hop")

    missing: list[str] = []
    with tempfile.TemporaryDirectory() as workdir, ExitStack() as stack:
        replicas = fake_replicas(stack)
        targets: dict[str, tuple[str, int | None]] = {}
        for name in names:
            started = start(stack, name, replicas, Path(workdir), args.baseline_tree)
            if isinstance(started, str):
                missing.append(f"- {name}: {started}")
            else:
                targets[name] = started
        cells = measure(targets, args)
    figures = summarize(cells, args)
    print(render(figures))
    if args.results:
        print(f"\nwrote {results.write(args.results, results.record('bench.hop', figures, argv), render)}")
    if missing:
        print("\nNot measured:\n" + "\n".join(missing))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
