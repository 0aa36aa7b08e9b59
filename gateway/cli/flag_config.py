"""Config without a file (`serve --replica URL --model NAME`) and `affinity-gateway check FILE`.

affinity-gateway serve --replica http://10.0.0.5:8000 --replica http://10.0.0.6:8000 --model llama [--policy P]
affinity-gateway check config.yaml     # validate; print the resolved config, secrets masked; exit 1 if bad
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from gateway.config.env import interpolated_paths, resolved
from gateway.config.loader import Config, load_config, parse_config
from gateway.config.policy_params import POLICY_CONFIGS, policy_config
from gateway.errors import ConfigError


def add_flag_config(p: argparse.ArgumentParser) -> None:
    """`serve`'s flags for a config-free start (one pool, every other key at its default)."""
    p.add_argument(
        "--replica",
        action="append",
        metavar="URL",
        help="a replica's base URL (repeat for more); with --model, instead of --config",
    )
    p.add_argument("--model", help="the served model name of the --replica pool")
    p.add_argument(
        "--policy",
        default="prefix_affinity",
        type=policy_arg,
        metavar="{" + ",".join(POLICY_CONFIGS) + "}",
        help="routing policy of the --replica pool (default: %(default)s)",
    )


def policy_arg(name: str) -> str:
    """argparse type of --policy: a known policy, else the nearest name (or the one another router calls it)."""
    try:
        policy_config(name, {}, "")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.reason) from None
    return name


def flag_config(replicas: Sequence[str], model: str, policy: str, env: Mapping[str, str]) -> Config:
    """The config `serve --replica ... --model ...` runs with; errors name the key as a file's would."""
    data = {"pools": {model: {"replicas": [{"url": url} for url in replicas], "routing": {"policy": policy}}}}
    try:
        return parse_config(data, env)
    except ConfigError as exc:  # name the flag the user gave, not the key of a file they never wrote
        raise ConfigError.of(
            [ConfigError(one.reason, key=_flag_of(one.key, model, replicas)) for one in exc.each]
        ) from None


def _flag_of(key: str, model: str, replicas: Sequence[str]) -> str:
    """The flag behind a key of the config the flags make: `--replica URL`, `--policy` or `--model`."""
    pool = f"pools.{model}"
    if key.startswith(f"{pool}.replicas["):
        index = int(key[len(f"{pool}.replicas[") :].split("]")[0])
        return f"--replica {replicas[index]}"
    if key.startswith(f"{pool}.routing"):
        return "--policy"
    return "--model" if key.startswith(("pools", "routes")) else key


def serve_config(args: argparse.Namespace) -> Config:
    """From --config, or from --replica/--model; ConfigError for a mix or neither."""
    if args.config is not None:
        if args.replica:
            raise ConfigError("give either --config or --replica/--model, not both", key="--replica")
        return load_config(args.config, os.environ)
    if not args.replica or not args.model:
        raise ConfigError(
            "needs --config FILE, or --replica URL (one or more) and --model NAME",
            key="--model" if args.replica else "--replica",
        )
    return flag_config(args.replica, args.model, args.policy, os.environ)


def add_check(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser("check", help="validate a config file and print it resolved (secrets masked)")
    p.add_argument("file", help="YAML config")
    p.set_defaults(run=_check)


def _check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file, os.environ)
    except ConfigError as exc:
        print_config_error(exc)
        return 1
    raw = yaml.safe_load(Path(args.file).read_text())
    print(f"# {args.file}: ok", flush=True)
    sys.stdout.write(yaml.safe_dump(resolved(with_policy_defaults(config), interpolated_paths(raw)), sort_keys=False))
    return 0


def print_config_error(exc: ConfigError) -> None:
    """Every mistake of the load on a line of its own, each with its file and dotted key."""
    mistakes = exc.each
    if len(mistakes) > 1:
        print(f"affinity-gateway: {len(mistakes)} config errors:", file=sys.stderr)
    for one in mistakes:
        print(f"affinity-gateway: config error: {one.line}", file=sys.stderr)


def with_policy_defaults(config: Config) -> Config:
    """`config` with each pool's routing params as the policy runs with them: every default filled in."""
    pools = {
        model: pool.model_copy(
            update={
                "routing": pool.routing.model_copy(
                    update={
                        "params": policy_config(
                            pool.routing.policy, pool.routing.params, f"pools.{model}.routing"
                        ).model_dump()
                    }
                )
            }
        )
        for model, pool in config.pools.items()
    }
    return config.model_copy(update={"pools": pools})
