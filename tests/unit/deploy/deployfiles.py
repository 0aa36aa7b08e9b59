"""Readers for the files in deploy/: the compose file, the Dockerfile, nginx.conf, the k8s manifests.

No container engine runs here, so the tests read these files the way the engines would and check
them against the code that will run inside: the gateway's config loader, both CLIs' parsers.
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from gateway.config.loader import Config, load_config
from replica_stub.cli import parse_args
from replica_stub.engine.registry import ENGINES
from tests.helpers import ROOT

DEPLOY = ROOT / "deploy"
REAL_ENGINE = "real"
CONFIG_PATH = "/etc/affinity-gateway/gateway.yaml"  # where the gateway image reads its config


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    return loaded


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """container path -> host path (relative to deploy/) of the service's bind mounts (not named volumes)."""
    out = {}
    for volume in service.get("volumes", ()):
        source, target, *_ = volume.split(":")
        if source.startswith((".", "/")):
            out[target] = source
    return out


def compose_gateway_config(service: dict[str, Any]) -> Config:
    """The config a compose gateway service runs with: its mounted file, loaded with its environment."""
    env = {k: str(v) for k, v in service["environment"].items()}
    return load_config(DEPLOY / mounts(service)[CONFIG_PATH], env=env)


def k8s_docs() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def host_port(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname, url
    return parts.hostname, parts.port or default_port


def stub_args(command: list[str]) -> argparse.Namespace:
    """Parse a replica command with replica-stub's own parser (an unknown flag or engine exits)."""
    assert flag(command, "--engine") in ENGINES
    return parse_args(command)


def flag(args: list[str], name: str) -> str:
    """The value after `--name` in an argument list."""
    assert name in args, f"{name} missing from {args}"
    return args[args.index(name) + 1]


@dataclass
class Stage:
    name: str
    base: str  # image or earlier stage
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, rest)


def dockerfile(path: Path = DEPLOY / "Dockerfile") -> dict[str, Stage]:
    """Stages by name, instructions with line continuations joined and comments dropped."""
    text = re.sub(
        r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    )
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        instruction, _, rest = line.strip().partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else f"stage{len(stages)}"
            current = stages[name] = Stage(name, words[0])
        elif current is not None:
            current.instructions.append((instruction, rest.strip()))
    return stages


def lineage(stages: dict[str, Stage], name: str) -> list[Stage]:
    """The stage and the stages it is built FROM, nearest first."""
    chain = [stages[name]]
    while chain[-1].base in stages:
        chain.append(stages[chain[-1].base])
    return chain


def last(stages: dict[str, Stage], name: str, instruction: str) -> str | None:
    """The effective value of an instruction (ENTRYPOINT, CMD, USER, HEALTHCHECK) for a target."""
    for stage in lineage(stages, name):
        values = [rest for ins, rest in stage.instructions if ins == instruction]
        if values:
            return values[-1]
    return None


def exec_form(rest: str) -> list[str]:
    """JSON exec form `["a", "b"]` or shell form, as a list of words."""
    rest = rest.strip()
    return yaml.safe_load(rest) if rest.startswith("[") else shlex.split(rest)


def nginx_directives(text: str) -> list[tuple[str, list[str]]]:
    """Flat (directive, args) pairs of nginx.conf, block nesting ignored."""
    text = re.sub(r"#[^\n]*", "", text)
    out = []
    for statement in re.split(r"[;{}]", text):
        words = shlex.split(statement.strip(), posix=True) if statement.strip() else []
        if words:
            out.append((words[0], words[1:]))
    return out
