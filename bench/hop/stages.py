"""Where one proxied request's CPU goes in our gateway, stage by stage, from a sampling profiler.

    python -m bench.hop.stages [--seconds 10] [--policy prefix_affinity] [--stream] [--top 0]

Starts three zero-delay replicas and one gateway (shipped defaults, the named policy), drives it with
wrk as `python -m bench.hop` does, and records the gateway with py-spy (`pip install py-spy`; as
root, or with ptrace allowed). Every sample is charged to one stage: the innermost frame of the
gateway's own code names it (`STAGES`, by module), and the samples of libraries that frame called
(httptools, prometheus_client, structlog, …) count to it as well, in their own column. Samples
with no gateway frame at all are the framework's own (aiohttp's server, the event loop): the floor a
bare proxy pays too. `--top N` also lists the N functions of our own code with the most samples.
`--results NAME` publishes the stage table (docs/benchmarks/results/NAME.json and .md, bench/results.py).

The gateway runs alone on the machine's last core, wrk and the replicas on the others (`pin`). py-spy
samples wall-clock time: on cores shared with its client and replicas the gateway is often runnable but
not running, and a sample then lands where it was preempted, most often right after a write that woke a
replica (the upstream send), which made "send" look several times its CPU cost. Pinned, the gateway is
on its core whenever it is runnable, so its samples are its CPU.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench import results
from bench.hop.processes import cpu_seconds, running
from bench.hop.rig import fake_replicas, gateway_config, wrk
from lab.cluster import free_port

# (stage, prefixes of `module` or `module:function` in gateway/); the first match wins. None: the
# frames around every request (the CLI, the server's start) are not a stage, so a sample whose
# innermost frame of ours is one of them is the framework's.
STAGES: tuple[tuple[str | None, tuple[str, ...]], ...] = (
    (None, ("gateway/__main__", "gateway/cli/", "gateway/serving/lifecycle", "gateway/serving/http_server")),
    (
        "background (probes, scrapes)",
        (
            "gateway/replicas/health",
            "gateway/replicas/load",
            "gateway/replicas/models",
            "gateway/routing/kv_feeds",
            "gateway/support/background",
        ),
    ),
    ("parse", ("gateway/edge/encoding", "gateway/edge/multipart_form", "gateway/prompt/api_shapes")),
    (
        "view",
        ("gateway/view", "gateway/routing/model_names", "gateway/routing/route_table", "gateway/serving/app:_resolved"),
    ),
    ("limits and auth", ("gateway/edge/", "gateway/serving/app:edge_middleware", "gateway/serving/app:_within")),
    ("prefix keying and hashing", ("gateway/prompt/", "gateway/index/")),
    ("policy", ("gateway/routing/",)),
    ("admission", ("gateway/serving/admission", "gateway/replicas/")),
    ("usage", ("gateway/relay/sse_usage", "gateway/relay/stream_usage", "gateway/request/usage")),
    (
        "send",
        (
            "gateway/relay/attempt",
            "gateway/relay/headers",
            "gateway/replicas/backend_auth",
            "gateway/relay/proxy:Proxy._send_once",
            "gateway/relay/upstream",
        ),
    ),
    ("relay", ("gateway/relay/",)),
    (
        "metrics",
        (
            "gateway/observability/metrics",
            "gateway/observability/request_metrics",
            "gateway/observability/routing_metrics",
            "gateway/observability/metric_children",
        ),
    ),
    ("log", ("gateway/log", "gateway/observability/request_log", "gateway/observability/decision_log")),
    ("tracing", ("gateway/observability/tracing",)),
    (
        "finished-request sinks",
        ("gateway/request/observers", "gateway/insights/", "gateway/observability/", "gateway/relay/shared_homes"),
    ),
    ("request bookkeeping", ("gateway/request/", "gateway/serving/")),
)
FRAMEWORK = "framework (aiohttp server, event loop)"


def stage_of(function: str, path: str) -> str | None:
    """The stage of a frame in our code, by its module and function; None for a frame outside
    `gateway/` or around every request."""
    if not path.startswith("gateway/"):
        if "/gateway/" not in path:
            return None
        path = path[path.find("/gateway/") + 1 :]
    where = f"{path.removesuffix('.py')}:{function}"
    for stage, prefixes in STAGES:
        if where.startswith(prefixes):
            return stage
    return "other (ours)"


def parse_frame(frame: str) -> tuple[str, str]:
    """py-spy's raw frame `function (path/to/file.py:line)` → (function, path)."""
    function, _, where = frame.partition(" (")
    return function, where.rpartition(":")[0]


def attribute(raw: Path) -> tuple[collections.Counter[tuple[str, bool]], collections.Counter[str], int]:
    """Samples per (stage, in our own code?), samples per function of ours, and the total."""
    stages: collections.Counter[tuple[str, bool]] = collections.Counter()
    functions: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [parse_frame(f) for f in stack.split(";")]
        innermost_ours = next(
            ((i, s) for i, frame in reversed(list(enumerate(frames))) if (s := stage_of(*frame)) is not None),
            None,
        )
        if innermost_ours is None:
            stages[(FRAMEWORK, False)] += count
            continue
        index, stage = innermost_ours
        stages[(stage, index == len(frames) - 1)] += count
        function, path = frames[index]
        functions[f"{function} ({path})"] += count
    return stages, functions, total


def summarize(
    stages: collections.Counter[tuple[str, bool]],
    total: int,
    args: argparse.Namespace,
    requests: int,
    cpu_ms: float,
    pinned: bool = False,
) -> dict[str, Any]:
    """The published figures: the run's set-up, CPU per request, and per stage (busiest first) its share
    of the samples in our own code and in the libraries that code called."""
    names = sorted({s for s, _ in stages}, key=lambda s: -(stages[(s, True)] + stages[(s, False)]))
    return {
        "policy": args.policy,
        "stream": args.stream,
        "connections": args.connections,
        "seconds": args.seconds,
        "requests": requests,
        "cpu_ms_per_request": cpu_ms,
        "pinned": pinned,
        "samples": total,
        "stages": [
            {"stage": name, "own": stages[(name, True)] / total, "called": stages[(name, False)] / total}
            for name in names
        ],
    }


def render(figures: dict[str, Any]) -> str:
    """The set-up in one line, then per stage its share of the gateway's CPU, that share in µs per request,
    and how it splits between our code and the libraries it calls."""
    cpu_ms = figures["cpu_ms_per_request"]
    counted = "" if figures["requests"] is None else f", {figures['requests']} requests, {figures['samples']} samples"
    alone = ", the gateway alone on a core" if figures.get("pinned") else ""
    lines = [
        f"Ours ({figures['policy']}, {'streaming' if figures['stream'] else 'whole answers'}), wrk -t2 "
        f"-c{figures['connections']} for {figures['seconds']:g} s{alone}: {cpu_ms:.3f} ms CPU per request under "
        f"py-spy{counted}.",
        "",
        "| stage | share of the gateway's CPU | µs per request | in our code | in libraries it calls |",
        "|---|---|---|---|---|",
    ]
    for row in figures["stages"]:
        share = row["own"] + row["called"]
        lines.append(
            f"| {row['stage']} | {share:.1%} | {share * cpu_ms * 1e3:.0f} | {row['own']:.1%} | {row['called']:.1%} |"
        )
    return "\n".join(lines)


def reserve_core() -> int | None:
    """Take this process's last core away from it and from what it starts next (the replicas, wrk), for the
    gateway; None on a machine with one core (nothing is pinned)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    os.sched_setaffinity(0, cores[:-1])
    return cores[-1]


def pin(pid: int, core: int) -> None:
    """Every thread of `pid` on `core` (a thread it starts later inherits its starter's)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task), {core})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hop.stages", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--policy", default="prefix_affinity", help="a policy, with +idle as bench.hop takes it")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--top", type=int, default=0, help="also list the N busiest functions of ours")
    parser.add_argument("--keep", type=Path, help="also copy py-spy's raw samples here (flamegraph input)")
    parser.add_argument("--results", metavar="NAME", help="also write docs/benchmarks/results/NAME.json and .md")
    args = parser.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        parser.error("py-spy is not installed (pip install py-spy; `make bench` does)")
    cores = os.sched_getaffinity(0)
    core = reserve_core()
    with tempfile.TemporaryDirectory() as workdir, ExitStack() as stack:
        stack.callback(os.sched_setaffinity, 0, cores)
        replicas = fake_replicas(stack)
        port = free_port()
        config = gateway_config(port, replicas, args.policy, Path(workdir))
        pid = stack.enter_context(running([sys.executable, "-m", "gateway", "serve", "--config", str(config)], port))
        if core is not None:
            pin(pid, core)
        url = f"http://127.0.0.1:{port}"
        wrk(url, 2, args.connections, args.stream, 2)  # warm-up
        raw = Path(workdir) / "samples.txt"
        spying = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(pid),
                "--rate",
                "250",
                "--format",
                "raw",
                "--nonblocking",
                "--duration",
                str(int(args.seconds)),
                "--output",
                str(raw),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        before = cpu_seconds(pid)
        done = wrk(url, 2, args.connections, args.stream, int(args.seconds))[0]
        cpu_s = cpu_seconds(pid) - before
        spying.wait(args.seconds + 60)
        stages, functions, total = attribute(raw)
        if args.keep:
            shutil.copyfile(raw, args.keep)
    cpu_ms = cpu_s * 1e3 / max(done, 1)
    figures = summarize(stages, total, args, done, cpu_ms, pinned=core is not None)
    print(render(figures))
    if args.results:
        print(f"\nwrote {results.write(args.results, results.record('bench.hop.stages', figures, argv), render)}")
    if args.top:
        print("\n| function of ours (innermost) | samples |\n|---|---|")
        print("\n".join(f"| {name} | {n / total:.1%} |" for name, n in functions.most_common(args.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
