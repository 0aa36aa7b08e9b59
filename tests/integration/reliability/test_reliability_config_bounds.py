"""A YAML alias bomb on reload, through a real gateway process: refused at once, running config kept.

A 1 KB file whose aliases name 10**8 leaves replaces the config of a running gateway, then a reload is
asked (`POST /admin/reload`, then SIGHUP). Before: the reload walked every leaf (37 s, 2.39 GB, 460 MB
kept). Now: a 400 ConfigError naming the aliases, in well under a second, RSS flat, requests served
throughout by the config that was running.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.gateway_procs import MODEL, pool, running, start_gateway, start_stub
from tests.integration.reliability_tools import chat, eventually, report
from tests.unit.gateway.config.test_yaml_bounds import alias_bomb

pytestmark = pytest.mark.timeout(60)


def _rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def test_alias_bomb_reload_is_refused_quickly(tmp_path: Path) -> None:
    with running() as track:
        stub = track(start_stub("only"))
        gateway = track(start_gateway(tmp_path, {MODEL: pool(("only", stub.url))}))
        pid = gateway.proc.popen.pid
        with httpx.Client(base_url=gateway.url, timeout=30) as http:
            assert http.post("/v1/chat/completions", json=chat()).status_code == 200
            before_kb = _rss_kb(pid)
            gateway.config_path.write_text(alias_bomb())
            started = time.monotonic()
            answer = http.post("/admin/reload")
            took_s = time.monotonic() - started
            gateway.proc.popen.send_signal(signal.SIGHUP)
            eventually(lambda: gateway.proc.output().count("config_reload_failed") >= 2, timeout_s=10)
            served = http.post("/v1/chat/completions", json=chat()).status_code
            rise_mb = (_rss_kb(pid) - before_kb) / 1024
        report(
            "alias bomb reload", [], status=answer.status_code, took_s=round(took_s, 3), rss_rise_mb=round(rise_mb, 1)
        )
        assert answer.status_code == 400, answer.text[:300]
        error = answer.json()["error"]
        assert error["type"] == "ConfigError" and "alias" in error["message"], error
        assert took_s < 1.0 and served == 200 and rise_mb < 20
