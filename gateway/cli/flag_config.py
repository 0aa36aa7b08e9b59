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
from gateway.errors import ConfigError


def add_flag_config(p: argparse.ArgumentParser) -> None:
    """`serve`'s flags for a config-free start (one pool, every other key at its default)."""
    p.add_argument("--replica", action="append", metavar="URL",
                   help="a replica's base URL (repeat for more); with --model, instead of --config")
    p.add_argument("--model", help="the served model name of the --replica pool")
    p.add_argument("--policy", default="prefix_affinity", help="routing policy of the --replica pool")


def flag_config(replicas: Sequence[str], model: str, policy: str, env: Mapping[str, str]) -> Config:
    """The config `serve --replica ... --model ...` runs with; errors name the key as a file's would."""
    data = {"pools": {model: {"replicas": [{"url": url} for url in replicas], "routing": {"policy": policy}}}}
    return parse_config(data, env)


def serve_config(args: argparse.Namespace) -> Config:
    """From --config, or from --replica/--model; ConfigError for a mix or neither."""
    if args.config is not None:
        if args.replica:
            raise ConfigError("give either --config or --replica/--model, not both", key="--replica")
        return load_config(args.config, os.environ)
    if not args.replica or not args.model:
        raise ConfigError("needs --config FILE, or --replica URL (one or more) and --model NAME",
                          key="--model" if args.replica else "--replica")
    return flag_config(args.replica, args.model, args.policy, os.environ)


def add_check(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser("check", help="validate a config file and print it resolved (secrets masked)")
    p.add_argument("file", help="YAML config")
    p.set_defaults(run=_check)


def _check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file, os.environ)
    except ConfigError as exc:
        print(f"affinity-gateway: config error: {exc}", file=sys.stderr)
        return 1
    raw = yaml.safe_load(Path(args.file).read_text())
    print(f"# {args.file}: ok", flush=True)
    sys.stdout.write(yaml.safe_dump(resolved(config, interpolated_paths(raw)), sort_keys=False))
    return 0
