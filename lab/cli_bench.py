"""`affinity-gateway bench` and `affinity-gateway simulate`: arguments in, `lab.benchmark` called.

    affinity-gateway bench URL -w multi-turn -p users=32 -p rounds=4 --rate 2 --out out/
    affinity-gateway bench --compare round_robin,prefix_affinity --replicas 4 --speedup 10 -w hot-prefix
    affinity-gateway simulate -w shared-prefix --replicas 64 --policies all --rate 20 --out out/

Workload parameters are the generator's keyword arguments (`-p name=value`, see
`lab/workloads.py`); `--rate` sets the workload's session arrival rate (`rate_per_s`).
"""

from __future__ import annotations

import argparse
import dataclasses
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import yaml

if TYPE_CHECKING:
    from gateway.config.pools import PricesConfig

ALL_POLICIES = ("round_robin", "least_loaded", "power_of_two", "consistent_hash", "session_affinity", "prefix_affinity")
_STUB_KEYS = (
    "speedup",
    "block_size",
    "num_gpu_blocks",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "timing",
)


def _workload_args(p: argparse.ArgumentParser) -> None:
    from lab.workloads import WORKLOADS

    p.add_argument("--workload", "-w", default="multi-turn", choices=list(WORKLOADS), help="default multi-turn")
    p.add_argument(
        "--param",
        "-p",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="workload parameter, repeatable (e.g. -p users=64 -p rounds=5; trace: -p path=FILE)",
    )
    p.add_argument("--rate", type=float, help="session arrival rate per second (the workload's rate_per_s)")
    p.add_argument(
        "--concurrency",
        type=int,
        default=0,
        help="closed loop: this many sessions at a time, back to back (ignores arrival times)",
    )
    p.add_argument("--seed", type=int, default=0, help="workload (and policy) seed")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="directory for result.json, table.md, PNGs")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--results",
        metavar="NAME",
        help="in a checkout of the project: also publish the table into docs/benchmarks/results/NAME.json and "
        "NAME.md, which the benchmark pages include",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no live progress bar")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="--compare: run every contestant this many times, interleaved (A B A B: drift hits all alike); "
        "a row per run, then one per contestant with the median of its runs' figures (default: %(default)s)",
    )
    p.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="error",
        help="--compare: the cluster's log level (info: our gateway's request events, each with its decision's "
        "scored candidates, on stdout; default: %(default)s)",
    )
    p.add_argument(
        "--prices",
        default="3,0.3,15",
        type=_prices,
        metavar="INPUT,CACHED,OUTPUT",
        help="money per million input, cached input and output tokens, for each run's cost and cache "
        "savings (default 3,0.3,15: example prices, a 90%% cache discount)",
    )
    p.add_argument(
        "--policy-param",
        "-P",
        action="append",
        default=[],
        metavar="POLICY.NAME=VALUE",
        help="simulate / bench --compare: a routing parameter of one policy, e.g. -P prefix_affinity.load_epsilon=0.5",
    )
    p.add_argument(
        "--evidence",
        default="history",
        metavar="history,events",
        help="simulate / bench --compare: what the gateway knows of the replicas' caches: its own routing "
        "history (character keys, no tokenizer) and/or their KV events (token keys); each policy "
        "runs once per value, an events run named <policy>+events",
    )


def add_bench(p: argparse.ArgumentParser) -> None:
    from replica_stub.scheduler import BATCHING

    p.add_argument("url", nargs="?", help="OpenAI-compatible base URL (gateway, other router or replica)")
    _workload_args(p)
    p.add_argument("--model", help="default: the first model the URL's /v1/models lists (with --compare: stub-model)")
    p.add_argument(
        "--compare",
        metavar="C1,C2,...",
        help="start fresh sim replicas + a router per contestant instead of URL: our policies "
        f"('all' = {','.join(ALL_POLICIES)}) and peers as ROUTER:POLICY (smg:cache_aware, "
        "sglang:cache_aware, vllm-router:consistent_hash, ...; `make peers` installs them)",
    )
    p.add_argument("--replicas", type=int, default=4, help="with --compare: replica stubs per cluster")
    p.add_argument("--speedup", type=float, default=10.0, help="with --compare: sim replicas' speed factor")
    p.add_argument(
        "--engine",
        default="sim",
        choices=("sim", "real", "vllm"),
        help="with --compare: the replicas (sim stubs, real-model stubs, or real vLLM: `make vllm`)",
    )
    p.add_argument("--num-gpu-blocks", type=int, help="with --compare: KV capacity per replica in 16-token blocks")
    p.add_argument(
        "--replica-cpu",
        type=float,
        metavar="SHARE",
        help="with --engine vllm: each replica capped at SHARE of a core, ahead of the router and the load "
        "generator within it, as a GPU replica computes alone (root; lab/core_budget.py)",
    )
    p.add_argument(
        "--batching",
        choices=BATCHING,
        help="with --compare: the replica stubs' batching (default continuous; static shows its cost)",
    )
    p.add_argument(
        "--no-ignore-eos",
        action="store_true",
        help="do not send ignore_eos (for servers that reject it; answers may then be shorter)",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, seconds")
    p.set_defaults(run=_bench)


def add_simulate(p: argparse.ArgumentParser) -> None:
    _workload_args(p)
    p.add_argument(
        "--policies",
        default="all",
        help=f"comma-separated ('all' = {','.join(ALL_POLICIES)}; 'oracle' is the lab's yardstick, lab/oracle.py)",
    )
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--num-gpu-blocks", type=int, default=4096, help="KV capacity per replica in 16-token blocks")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--speedup", type=float, default=1.0, help="divide every step time by this (as the stub does)")
    p.add_argument("--scrape-interval", type=float, default=0.25, help="gateway load scrape period, seconds")
    p.set_defaults(run=_simulate)


def _sessions(args: argparse.Namespace) -> tuple[list[Any], dict[str, Any]]:
    from lab.workloads import build

    params: dict[str, Any] = dict(_pair(item) for item in args.param)
    if args.rate is not None:
        params["rate_per_s"] = args.rate
    sessions = build(args.workload, params, seed=args.seed)
    meta = {
        "workload": args.workload,
        "params": params,
        "seed": args.seed,
        "concurrency": args.concurrency,
        "sessions": len(sessions),
        "requests": sum(len(s.user_turns) for s in sessions),
    }
    return sessions, meta


def _pair(item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep:
        raise ValueError(f"expected NAME=VALUE, got {item!r}")
    return name.strip(), value.strip()


def _policies(value: str) -> list[str]:
    return list(ALL_POLICIES) if value == "all" else [p.strip() for p in value.split(",") if p.strip()]


def _bench(args: argparse.Namespace) -> int:
    from lab import benchmark, peers
    from lab.cluster import ClusterSpec
    from lab.core_budget import usable_share
    from lab.published import with_medians

    if bool(args.url) == bool(args.compare):
        print("affinity-gateway bench: give either a URL or --compare POLICIES", flush=True)
        return 2
    contestants = _policies(args.compare or "")
    try:
        sessions, meta = _sessions(args)
        evidence = _evidence(args.evidence)
        policy_params = _policy_params(args.policy_param)
        for name in contestants:
            peers.contestant(name)
    except (ValueError, OSError) as exc:
        print(f"affinity-gateway bench: {exc}")
        return 2
    if args.rounds < 1 or (args.rounds > 1 and not args.compare):
        print("affinity-gateway bench: --rounds takes an integer >= 1, and more than one only with --compare")
        return 2
    if args.batching and args.engine == "vllm":
        print("affinity-gateway bench: --batching is a replica-stub flag (vLLM batches continuously)")
        return 2
    if args.replica_cpu is not None and not (args.engine == "vllm" and usable_share(args.replica_cpu)):
        print("affinity-gateway bench: --replica-cpu takes a share of a core between 0.05 and 1, with --engine vllm")
        return 2
    if peers.needs_isolation(contestants):  # root: peers run offline, in a loopback-only namespace
        return peers.rerun_isolated(args.argv)
    if args.compare:
        cluster = ClusterSpec(
            replicas=args.replicas,
            model=args.model or "stub-model",
            speedup=args.speedup,
            log_level=args.log_level,
            num_gpu_blocks=args.num_gpu_blocks,
            engine=args.engine,
            stub_flags=("--batching", args.batching) if args.batching else (),
            replica_cpu=args.replica_cpu,
        )
        meta.update(
            mode="bench --compare",
            replicas=args.replicas,
            speedup=args.speedup,
            engine=args.engine,
            num_gpu_blocks=args.num_gpu_blocks,
            replica_cpu=args.replica_cpu,
            batching=args.batching or "continuous",
            evidence=evidence,
            policy_params=policy_params,
        )
        labels: dict[str, dict[str, str]] = {}
        meta["contestants"] = labels
        meta["rounds"] = args.rounds
        rounds = [
            benchmark.bench_compare(
                contestants,
                sessions,
                cluster,
                concurrency=args.concurrency,
                timeout_s=args.timeout,
                show=not args.quiet,
                evidence=evidence,
                policy_params=policy_params,
                labels=labels,
            )
            for _ in range(args.rounds)
        ]
        runs = rounds[0] if args.rounds == 1 else with_medians(rounds)
    else:
        meta.update(mode="bench", url=args.url)
        try:
            model = args.model or served_model(args.url)
        except (OSError, ValueError) as exc:
            print(f"affinity-gateway bench: cannot tell which model {args.url} serves ({exc}): give --model")
            return 2
        runs = {
            "bench": benchmark.bench_url(
                args.url,
                model,
                sessions,
                concurrency=args.concurrency,
                ignore_eos=not args.no_ignore_eos,
                timeout_s=args.timeout,
                show=not args.quiet,
            )
        }
    return _finish(args, runs, meta)


def served_model(url: str) -> str:
    """The first model the target lists: what `make run` serves is what a bare `bench URL` measures."""
    with urllib.request.urlopen(f"{url.rstrip('/')}/v1/models", timeout=10) as answer:
        listed = orjson.loads(answer.read()).get("data") or []
    if not listed or not isinstance(listed[0], dict) or not isinstance(listed[0].get("id"), str):
        raise ValueError("its /v1/models lists no model")
    return str(listed[0]["id"])


def _simulate(args: argparse.Namespace) -> int:
    from lab import benchmark
    from lab.sim_spec import SimSpec
    from replica_stub.config import StubConfig

    try:
        sessions, meta = _sessions(args)
        policy_params = _policy_params(args.policy_param)
        stub = StubConfig(
            num_gpu_blocks=args.num_gpu_blocks, max_num_seqs=args.max_num_seqs, speedup=args.speedup
        ).resolved()
        evidence = _evidence(args.evidence)
    except (ValueError, OSError) as exc:
        print(f"affinity-gateway simulate: {exc}")
        return 2
    spec = SimSpec(
        replicas=args.replicas,
        stub=stub,
        scrape_interval_s=args.scrape_interval,
        concurrency=args.concurrency,
        seed=args.seed,
    )
    meta.update(
        mode="simulate",
        replicas=args.replicas,
        policy_params=policy_params,
        stub={k: v for k, v in dataclasses.asdict(stub).items() if k in _STUB_KEYS},
    )
    effective: dict[str, Any] = {}
    meta["effective_policy_params"] = effective
    meta["evidence"] = evidence
    runs = benchmark.simulate_policies(
        _policies(args.policies),
        sessions,
        spec,
        policy_params,
        show=not args.quiet,
        effective=effective,
        evidence=evidence,
    )
    return _finish(args, runs, meta)


def _policy_params(items: list[str]) -> dict[str, dict[str, Any]]:
    """`-P policy.name=value` flags → {policy: {name: value}}, values read as YAML scalars (as the
    config file would give them) and checked by the policy now, not when a run starts."""
    from gateway.config.policy_params import policy_config
    from gateway.errors import ConfigError

    params: dict[str, dict[str, Any]] = {}
    for item in items:
        key, value = _pair(item)
        policy, _, name = key.partition(".")
        if not name:
            raise ValueError(f"expected POLICY.NAME=VALUE, got {item!r}")
        params.setdefault(policy, {})[name] = yaml.safe_load(value)
    for policy, values in params.items():
        try:
            policy_config(policy, values, f"-P {policy}")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    return params


def _prices(value: str) -> PricesConfig:
    """`--prices 3,0.3,15` → PricesConfig, checked as the config file's `pools.<model>.prices`."""
    from gateway.config import schema
    from gateway.config.pools import PricesConfig
    from gateway.errors import ConfigError

    try:
        input_, cached, output = (float(part) for part in value.split(","))
        return schema.build(PricesConfig, {"input": input_, "cached_input": cached, "output": output}, "--prices")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected INPUT,CACHED,OUTPUT per million tokens, got {value!r}") from None


def _evidence(value: str) -> list[str]:
    evidence = [e.strip() for e in value.split(",") if e.strip()]
    if not evidence or set(evidence) - {"history", "events"}:
        raise ValueError(f"--evidence takes history and/or events, got {value!r}")
    return evidence


def _finish(args: argparse.Namespace, runs: Any, meta: dict[str, Any]) -> int:
    from lab.benchmark import write_outputs
    from lab.published import publish
    from lab.results import table

    for summary, _ in runs.values():
        summary.price(args.prices)
    meta["prices"] = args.prices.model_dump()
    path = write_outputs(args.out, runs, meta, plots=not args.no_plots)
    print(table({name: summary for name, (summary, _) in runs.items()}))
    if args.results:
        publish(args.results, {name: summary.to_dict() for name, (summary, _) in runs.items()}, meta, args.argv)
    print(f"\nwrote {path}" + ("" if args.no_plots else ", table.md and plots") + f" in {args.out}")
    return 1 if any(summary.errors for summary, _ in runs.values()) else 0
