"""`affinity-gateway` commands: parse arguments, call the app code, nothing else.

    affinity-gateway serve --config config.yaml [--host H] [--port P] [--workers N] [--log-level L]
    affinity-gateway serve --replica URL [--replica URL ...] --model NAME [--policy P] [--port P]
    affinity-gateway check config.yaml   (see gateway/cli/flag_config.py)
    affinity-gateway prefix-report URL   (see gateway/cli/prefix_report.py)
    affinity-gateway up [--replicas 3] [--port 8000] ...   (see lab/cli_up.py)
    affinity-gateway bench URL | --compare P1,P2 ... / affinity-gateway simulate ...   (see lab/cli_bench.py)

More subcommands register themselves the same way: one `_add_<name>` function. The lab's commands
(`up`, `bench`, `simulate`: lab/) are named here, and their arguments and code are imported
only when one of them runs, so that `serve` never loads the lab.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from gateway import __version__
from gateway.cli.arg_types import workers_arg
from gateway.cli.flag_config import add_check, add_flag_config, print_config_error, serve_config
from gateway.cli.prefix_report import add_prefix_report
from gateway.config.loader import ENV_PREFIX
from gateway.errors import ConfigError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="affinity-gateway", description="Cache-affinity gateway for LLM replicas")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    argv = list(sys.argv[1:] if argv is None else argv)
    _add_serve(commands)
    _add_lab(commands, argv[0] if argv else None)
    add_check(commands)
    add_prefix_report(commands)
    _add_config_reference(commands)
    args = parser.parse_args(argv)
    args.argv = argv  # bench re-runs itself in a network namespace
    try:
        return int(args.run(args))
    except BrokenPipeError:  # `affinity-gateway check ... | head`: the reader is gone, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 0


def _add_lab(commands: argparse._SubParsersAction, chosen: str | None) -> None:  # type: ignore[type-arg]
    """The lab's commands by name and help; only the chosen one (the first argument: there are no
    options before the command but --version and --help) gets its arguments, from the lab."""
    up = commands.add_parser("up", help="start a local cluster: N replica stubs and one or more gateways")
    bench = commands.add_parser(
        "bench", help="drive a seeded workload against a URL (or compare policies on fresh clusters)"
    )
    simulate = commands.add_parser(
        "simulate", help="discrete-event simulation: N sim replicas, the real policies, virtual time"
    )
    if chosen == "up":
        from lab.cli_up import add_up

        add_up(up)
    elif chosen == "bench":
        from lab.cli_bench import add_bench

        add_bench(bench)
    elif chosen == "simulate":
        from lab.cli_bench import add_simulate

        add_simulate(simulate)


def _add_config_reference(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser("config-reference", help="print every config key: the reference page, or a JSON Schema")
    p.add_argument("--json-schema", action="store_true", help="a JSON Schema of the config file, for editors")
    p.set_defaults(run=_config_reference)


def _config_reference(args: argparse.Namespace) -> int:
    from gateway.config.reference import json_schema, markdown

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n" if args.json_schema else markdown())
    return 0


def _add_serve(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "serve",
        help="run the gateway from a config file (or --replica/--model)",
        description="Run the gateway: an OpenAI/vLLM-compatible endpoint that sends each request to the replica\n"
        "that will answer it first, its prompt's prefix cache counted in. Flags win over\n"
        f"{ENV_PREFIX}* variables, which win over the file.",
        epilog="examples:\n"
        "  affinity-gateway serve --replica http://10.0.0.5:8000 --replica http://10.0.0.6:8000 --model llama\n"
        "  affinity-gateway serve --config config.yaml --workers 2\n"
        f"  {ENV_PREFIX}CONFIG=config.yaml affinity-gateway serve",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", "-c", help=f"YAML config, see config.example.yaml (env {ENV_PREFIX}CONFIG)")
    add_flag_config(p)
    p.add_argument("--host", help=f"listen host (env {ENV_PREFIX}HOST; default: listen.host, 0.0.0.0)")
    p.add_argument("--port", type=int, help=f"listen port (env {ENV_PREFIX}PORT; default: listen.port, 8000)")
    p.add_argument(
        "--workers",
        type=workers_arg,
        help=f"gateway processes on the port, SO_REUSEPORT, one supervisor "
        f"(env {ENV_PREFIX}WORKERS; default: listen.workers, 1)",
    )
    p.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        help=f"env {ENV_PREFIX}LOG_LEVEL; default: logging.level, info",
    )
    p.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)  # set by serving.workers' supervisor
    p.add_argument("--worker-group", help=argparse.SUPPRESS)
    p.set_defaults(run=_serve)


def _serve(args: argparse.Namespace) -> int:
    from gateway.log import setup_logging
    from gateway.serving.app import make_app
    from gateway.serving.lifecycle import serve

    if args.config is None and not args.replica:
        args.config = os.environ.get(ENV_PREFIX + "CONFIG")  # the file, when no flag names one
    # Flags win over env, env over the file; set as env so a reload (SIGHUP) keeps them.
    for name, value in (
        ("HOST", args.host),
        ("PORT", args.port),
        ("WORKERS", args.workers),
        ("LOG_LEVEL", args.log_level),
    ):
        if value is not None:
            os.environ[ENV_PREFIX + name] = str(value)
    try:
        config = serve_config(args)
    except ConfigError as exc:
        print_config_error(exc)
        return 2
    if config.listen.workers > 1 and args.worker_index is None and args.config is None:
        # The supervisor starts its workers on the file; a config-free start has none to give them.
        print("affinity-gateway: config error: --workers above 1 needs --config", file=sys.stderr)
        return 2
    setup_logging(config.logging.level, config.logging.format)
    if args.worker_index is not None:  # one of `serve --workers N`
        import structlog

        from gateway.serving.workers import WorkerSpec, attach

        spec = WorkerSpec(args.worker_index, config.listen.workers, args.worker_group)
        structlog.contextvars.bind_contextvars(worker=spec.index)
        serve(
            attach(make_app(config, args.config, handle_sighup=True), spec),
            config,
            reuse_port=True,
            private_socket=spec.socket(),
        )
    elif config.listen.workers > 1:
        from gateway.serving.workers import drain_time_s, supervise

        return supervise(
            args.config, config.listen.workers, drain_time_s(config.shutdown.ready_delay_s, config.shutdown.grace_s)
        )
    else:
        serve(make_app(config, args.config, handle_sighup=args.config is not None), config)
    return 0
