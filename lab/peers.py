"""Other routers as benchmark contestants: SGLang Model Gateway, sglang-router and vllm-router (and the lab's
engine-aware oracle, `oracle`, in front of sim stubs: a yardstick started the same way).

`bench --compare prefix_affinity,smg:cache_aware,vllm-router:consistent_hash` names each peer as
`<peer>:<policy>`. A peer runs from its own venv under `.peers/<peer>/` (`make peers` installs
the pinned versions below), in front of the same fresh replica stubs as the gateway, with the
defaults a new user gets: only the listen address, the workers, the policy and the metrics
port are set, plus what keeps it offline (no tokenizer download, `HF_HUB_OFFLINE=1`). A
contestant that is named but not installed is an error, never a silently shorter table.

As root, `bench` runs the whole comparison inside a loopback-only network namespace
(`rerun_isolated`), so nothing a peer does can reach past this machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PEERS_DIR = Path(os.environ.get("AFFINITY_PEERS_DIR", Path(__file__).resolve().parents[1] / ".peers"))


@dataclass(frozen=True)
class Peer:
    name: str  # as contestants name it: "<name>:<policy>"
    package: str  # PyPI distribution, installed pinned by `make peers`
    version: str
    policies: tuple[str, ...]
    launcher: tuple[str, ...]  # argv head, relative to the venv's bin/
    offline_flags: tuple[str, ...] = ()  # keep it from fetching a tokenizer

    def venv(self) -> Path:
        return PEERS_DIR / self.name

    def installed(self) -> bool:
        return (self.venv() / ".installed").exists()  # `make peers` stamps a finished install

    def head(self) -> list[str]:
        """The argv that starts it, before its flags."""
        return [str(self.venv() / "bin" / self.launcher[0]), *self.launcher[1:]]

    def command(self, policy: str, port: int, workers: list[str], metrics_port: int) -> list[str]:
        return [
            *self.head(),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            *workers,
            "--policy",
            policy,
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(metrics_port),
            "--log-level",
            "error",
            *self.offline_flags,
        ]


PEERS: dict[str, Peer] = {
    p.name: p
    for p in (
        Peer(
            "smg",
            "smg",
            "1.13.0",
            ("cache_aware", "prefix_hash", "round_robin", "power_of_two", "consistent_hashing"),
            ("smg", "launch"),
            ("--disable-tokenizer-autoload",),
        ),
        Peer(
            "sglang",
            "sglang-router",
            "0.3.2",
            ("cache_aware", "round_robin", "power_of_two"),
            ("python", "-m", "sglang_router.launch_router"),
        ),
        Peer(
            "vllm-router",
            "vllm-router",
            "0.1.17",
            ("cache_aware", "consistent_hash", "round_robin", "power_of_two"),
            ("vllm-router",),
        ),
    )
}


@dataclass(frozen=True)
class LabRouter(Peer):
    """A router of the lab's own (a yardstick, not a peer): runs from this checkout's Python, no venv of its own."""

    def installed(self) -> bool:
        return True

    def head(self) -> list[str]:
        return [sys.executable, *self.launcher]


# `bench --compare oracle`: routes by the sim stubs' own TTFT forecasts (lab/oracle_router.py); sim engine only.
ORACLE = LabRouter("oracle", "lab.oracle_router", "lab", ("engine",), ("-m", "lab.oracle_router"))


@dataclass(frozen=True)
class Contestant:
    """One column of a comparison: one of our policies, or a peer router with one of its policies."""

    name: str  # as given: "prefix_affinity" or "smg:cache_aware"
    peer: Peer | None
    policy: str


def contestant(name: str) -> Contestant:
    """Parse `policy` or `peer:policy`; ValueError names what is wrong (unknown, or not installed)."""
    peer_name, sep, policy = name.partition(":")
    if name == ORACLE.name:
        return Contestant(name, ORACLE, "engine")
    if not sep:
        return Contestant(name, None, name)
    peer = PEERS.get(peer_name)
    if peer is None:
        raise ValueError(f"unknown router {peer_name!r} in {name!r} (known: {', '.join(PEERS)})")
    if policy not in peer.policies:
        raise ValueError(f"{peer.package} has no policy {policy!r} here (known: {', '.join(peer.policies)})")
    if not peer.installed():
        raise ValueError(
            f"contestant {name!r}: {peer.package} {peer.version} is not installed in {peer.venv()} (run `make peers`)"
        )
    return Contestant(name, peer, policy)


def peer_env() -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "DO_NOT_TRACK": "1",
        "RUST_LOG": "error",
        "NO_COLOR": "1",
    }


def isolated() -> bool:
    """True when this process sees no network interface but loopback."""
    try:
        return set(os.listdir("/sys/class/net")) <= {"lo"}
    except OSError:
        return False


def needs_isolation(names: list[str]) -> bool:
    """Peers run offline: as root (where `ip netns` works) outside a loopback-only namespace, move there."""
    wants = any(contestant(n).peer is not None for n in names)
    return wants and os.geteuid() == 0 and shutil.which("ip") is not None and not isolated()


@contextmanager
def namespace() -> Iterator[list[str]]:
    """A fresh loopback-only network namespace; yields the argv prefix that runs a command in it."""
    name = f"affinity-bench-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        prefix = ["ip", "netns", "exec", name]
        subprocess.run([*prefix, "ip", "link", "set", "lo", "up"], check=True)
        yield prefix
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def rerun_isolated(argv: list[str], module: str = "gateway") -> int:
    """Run `python -m <module> <argv>` again inside a loopback-only namespace; its exit code."""
    with namespace() as prefix:
        return subprocess.call([*prefix, sys.executable, "-m", module, *argv])
