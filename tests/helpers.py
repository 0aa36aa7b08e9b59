"""Shared test helpers: real processes on free loopback ports, waited on until healthy."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from lab.cluster import free_port  # the tests take ports from here

__all__ = ["ROOT", "free_port"]
from lab.tether import Tethered

ROOT = Path(__file__).resolve().parent.parent


class Proc:
    """A child process whose output goes to a temp log file (printed if it fails to start); it and
    its own children (vLLM's engine) die with the test process, also when that is SIGKILLed."""

    def __init__(self, args: Sequence[str], *, env: dict[str, str] | None = None) -> None:
        self.args = list(args)
        self.log = tempfile.NamedTemporaryFile(prefix="proc-", suffix=".log", delete=False)
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.tethered = Tethered(self.args, stdout=self.log, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT)
        self.popen = self.tethered.popen

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        if self.alive():
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self.tethered.release()
        self.log.close()  # the child had its own descriptor; output() reads the file by name

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


def wait_http(url: str, proc: Proc | None = None, timeout: float = 30.0) -> None:
    """Poll `url` until it answers 200; fail with the process log if it dies or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"process exited early ({proc.args}):\n{proc.output()[-4000:]}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout}s:\n{proc.output()[-4000:] if proc else ''}")


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


def must_run_redis() -> bool:
    """With CI=true the Redis-backed tests must run, never skip."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")
