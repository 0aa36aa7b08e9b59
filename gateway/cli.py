"""`affinity-gateway` commands: parse arguments, call the app code, nothing else.

    affinity-gateway serve --config config.yaml [--host H] [--port P] [--workers N] [--log-level L]
    affinity-gateway serve --replica URL [--replica URL ...] --model NAME [--policy P] [--port P]
    affinity-gateway check config.yaml   (see gateway/cli_config.py)
    affinity-gateway up [--replicas 3] [--port 8000] [--policy prefix_affinity] [--engine sim] [--speedup 1]
                        [--gateways 2 --redis [redis://host:6379/0]] [--workers N]

    affinity-gateway bench URL | --compare P1,P2 ... / affinity-gateway simulate ...   (see gateway/cli_bench.py)

More subcommands register themselves the same way: one `_add_<name>` function.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from gateway import __version__
from gateway.cli_bench import add_bench, add_simulate
from gateway.cli_config import add_check, add_flag_config, serve_config
from gateway.cluster import START_REDIS
from gateway.config import ENV_PREFIX
from gateway.errors import ConfigError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="affinity-gateway", description="Cache-affinity gateway for LLM replicas")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_serve(commands)
    _add_up(commands)
    add_bench(commands)
    add_simulate(commands)
    add_check(commands)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # bench re-runs itself in a network namespace
    return int(args.run(args))


def _add_serve(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser("serve", help="run the gateway from a config file (or --replica/--model)")
    p.add_argument("--config", "-c", help="YAML config (see config.example.yaml)")
    add_flag_config(p)
    p.add_argument("--host", help=f"listen host (env {ENV_PREFIX}HOST)")
    p.add_argument("--port", type=int, help=f"listen port (env {ENV_PREFIX}PORT)")
    p.add_argument("--workers", type=_workers, help=f"gateway processes on the port, SO_REUSEPORT, one supervisor "
                                                   f"(env {ENV_PREFIX}WORKERS, default 1: no supervisor)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help=f"env {ENV_PREFIX}LOG_LEVEL")
    p.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)  # set by the supervisor (gateway.workers)
    p.add_argument("--worker-group", help=argparse.SUPPRESS)
    p.set_defaults(run=_serve)


def _workers(text: str) -> int:
    """argparse type of --workers: an integer >= 1 (argparse names the option in its error)."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {count}")
    return count


def _serve(args: argparse.Namespace) -> int:
    from gateway.log import setup_logging
    from gateway.lifecycle import serve
    from gateway.server import make_app

    # Flags win over env, env over the file; set as env so a reload (SIGHUP) keeps them.
    for name, value in (("HOST", args.host), ("PORT", args.port), ("WORKERS", args.workers),
                        ("LOG_LEVEL", args.log_level)):
        if value is not None:
            os.environ[ENV_PREFIX + name] = str(value)
    try:
        config = serve_config(args)
    except ConfigError as exc:
        print(f"affinity-gateway: config error: {exc}", file=sys.stderr)
        return 2
    if config.listen.workers > 1 and args.worker_index is None and args.config is None:
        # The supervisor starts its workers on the file; a config-free start has none to give them.
        print("affinity-gateway: config error: --workers above 1 needs --config", file=sys.stderr)
        return 2
    setup_logging(config.logging.level, config.logging.format)
    if args.worker_index is not None:  # one of `serve --workers N`
        import structlog

        from gateway.workers import WorkerSpec, attach

        spec = WorkerSpec(args.worker_index, config.listen.workers, args.worker_group)
        structlog.contextvars.bind_contextvars(worker=spec.index)
        serve(attach(make_app(config, args.config, handle_sighup=True), spec), config, reuse_port=True,
              private_socket=spec.socket())
    elif config.listen.workers > 1:
        from gateway.workers import drain_time_s, supervise

        return supervise(args.config, config.listen.workers,
                         drain_time_s(config.shutdown.ready_delay_s, config.shutdown.grace_s))
    else:
        serve(make_app(config, args.config, handle_sighup=args.config is not None), config)
    return 0


def _add_up(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser("up", help="start a local cluster: N replica stubs and one or more gateways")
    p.add_argument("--replicas", type=int, default=3, help="number of replica stubs")
    p.add_argument("--port", type=int, default=8000, help="gateway port")
    p.add_argument("--host", default="127.0.0.1", help="gateway listen host")
    p.add_argument("--policy", default="prefix_affinity", help="routing policy of the pool")
    p.add_argument("--model", help="model name the replicas serve (default stub-model; smollm2 with --engine vllm)")
    p.add_argument("--engine", default="sim", choices=("sim", "real", "auto", "vllm"),
                   help="replica engine: sim (calibrated simulator), real (the stub's real model), "
                        "vllm (real vLLM's CPU build, `make vllm`)")
    p.add_argument("--speedup", type=float, default=1.0, help="simulated engine speed factor")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--gateways", type=int, default=1, help="gateway processes, on --port, --port+1, ...")
    p.add_argument("--redis", nargs="?", const=START_REDIS, metavar="URL",
                   help="share warm-prefix tables through this Redis; without URL, start a private redis-server")
    p.add_argument("--no-kv-events", dest="kv_events", action="store_false",
                   help="route from the gateway's own history instead of the replicas' KV events")
    p.add_argument("--workers", type=_workers, default=1, help="worker processes per gateway (serve --workers)")
    p.set_defaults(run=_up)


def _up(args: argparse.Namespace) -> int:
    from gateway.cluster import ClusterSpec, run_cluster

    model = args.model or ("smollm2" if args.engine == "vllm" else "stub-model")
    spec = ClusterSpec(replicas=args.replicas, port=args.port, host=args.host, policy=args.policy,
                       model=model, engine=args.engine, speedup=args.speedup, log_level=args.log_level,
                       gateways=args.gateways, redis=args.redis, kv_events=args.kv_events,
                       workers=args.workers)
    return run_cluster(spec)
