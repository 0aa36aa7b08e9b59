"""`affinity-gateway up`: a local cluster of replica stubs (or real vLLM) and gateways, from its arguments.

affinity-gateway up [--replicas 3] [--port 8000] [--policy prefix_affinity] [--engine sim] [--speedup 1]
                    [--gateways 2 --redis [redis://host:6379/0]] [--workers N]
"""

from __future__ import annotations

import argparse

from gateway.cli.arg_types import workers_arg
from gateway.cli.flag_config import policy_arg
from lab.cluster import START_REDIS, ClusterSpec, run_cluster


def add_up(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    p.add_argument("--replicas", type=int, default=3, help="number of replica stubs")
    p.add_argument("--port", type=int, default=8000, help="gateway port")
    p.add_argument("--host", default="127.0.0.1", help="gateway listen host")
    p.add_argument("--policy", default="prefix_affinity", type=policy_arg, help="routing policy of the pool")
    p.add_argument("--model", help="model name the replicas serve (default stub-model; smollm2 with --engine vllm)")
    p.add_argument(
        "--engine",
        default="sim",
        choices=("sim", "real", "auto", "vllm"),
        help="replica engine: sim (calibrated simulator), real (the stub's real model), "
        "vllm (real vLLM's CPU build, `make vllm`)",
    )
    p.add_argument("--speedup", type=float, default=1.0, help="simulated engine speed factor")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--gateways", type=int, default=1, help="gateway processes, on --port, --port+1, ...")
    p.add_argument(
        "--redis",
        nargs="?",
        const=START_REDIS,
        metavar="URL",
        help="share warm-prefix tables through this Redis; without URL, start a private redis-server",
    )
    p.add_argument(
        "--no-kv-events",
        dest="kv_events",
        action="store_false",
        help="route from the gateway's own history instead of the replicas' KV events",
    )
    p.add_argument("--workers", type=workers_arg, default=1, help="worker processes per gateway (serve --workers)")
    p.set_defaults(run=_up)


def _up(args: argparse.Namespace) -> int:
    model = args.model or ("smollm2" if args.engine == "vllm" else "stub-model")
    spec = ClusterSpec(
        replicas=args.replicas,
        port=args.port,
        host=args.host,
        policy=args.policy,
        model=model,
        engine=args.engine,
        speedup=args.speedup,
        log_level=args.log_level,
        gateways=args.gateways,
        redis=args.redis,
        kv_events=args.kv_events,
        workers=args.workers,
    )
    return run_cluster(spec)
