"""The prompt-prefix hygiene report over real processes: two tenants send the same ~2,000-token system
prompt, one with a timestamp in its first line. The report (JSON and the CLI's table) names that tenant,
a divergence in block 0 and about 2,000 recoverable tokens, priced; the clean tenant is not reported.
With `logging.prompts: true` (after a reload) only, it shows the text around the divergence."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.edge.auth import hash_key
from tests.helpers import ROOT
from tests.integration.gateway_procs import MODEL, Gateway, pool, running, start_gateway, start_stub
from tests.integration.reliability_tools import eventually

pytestmark = pytest.mark.timeout(90)
ADMIN, CLOCK, CLEAN = "sk-admin-hygiene-01", "sk-clock-hygiene-23", "sk-clean-hygiene-45"
KEYS = [
    {"sha256": hash_key(ADMIN), "tenant": "ops", "admin": True},
    {"sha256": hash_key(CLOCK), "tenant": "clock"},
    {"sha256": hash_key(CLEAN), "tenant": "clean"},
]
PRICES = {"input": 3.0, "cached_input": 0.3, "output": 15.0}
# ~8,000 characters: ~2,000 tokens at routing.prefix.chars_per_token 4
BODY = "\n".join(
    f"Rule {i}: when the traveller asks about leg {i}, quote the fare table and the refund policy." for i in range(90)
)


def ask(gateway: Gateway, key: str, first_line: str, turn: int) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 2,
        "messages": [
            {"role": "system", "content": f"{first_line}\n{BODY}"},
            {"role": "user", "content": f"Question {turn}: which leg is cheapest?"},
        ],
    }
    answer = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=body, timeout=20, headers={"Authorization": f"Bearer {key}"}
    )
    assert answer.status_code == 200, answer.text


def report(gateway: Gateway) -> dict[str, Any]:
    return httpx.get(
        f"{gateway.url}/admin/prefix-report", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5
    ).json()


def test_a_timestamp_in_the_first_line_is_reported_for_its_tenant_only(tmp_path: Path) -> None:
    assert 7500 < len(BODY) < 8500
    with running() as track:
        stub = track(start_stub("only"))
        gateway = track(
            start_gateway(
                tmp_path,
                {MODEL: {**pool(("only", stub.url), policy="prefix_affinity"), "prices": PRICES}},
                auth={"keys": KEYS},
            )
        )
        for turn in range(3):
            ask(gateway, CLOCK, f"Current time: 2026-12-04T20:00:0{turn}Z", turn)
            ask(gateway, CLEAN, "You are the travel desk", turn)
        eventually(lambda: report(gateway)["analysed_requests"] == 6)
        found = report(gateway)
        assert [f["tenant"] for f in found["families"]] == ["clock"], found
        clock = found["families"][0]
        assert clock["divergence"] == {"block": 0, "token_offset": 9}  # "Current time: 2026-12-04T20:00:0" is shared
        assert clock["affected_requests"] == 2 and clock["requests_seen"] == 3
        assert 1900 <= clock["recoverable_tokens"] <= 2100
        assert clock["lost"]["tokens"] == pytest.approx(2 * clock["recoverable_tokens"], rel=0.01)
        assert clock["lost"]["prefill_s"] > 0
        assert clock["lost"]["cost"] == pytest.approx(clock["lost"]["tokens"] * 2.7 / 1e6)
        assert "around" not in clock  # no prompt text without logging.prompts

        table = subprocess.run(
            [sys.executable, "-m", "gateway", "prefix-report", gateway.url, "--admin-key", ADMIN],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=ROOT,
            check=True,
        ).stdout
        lines = table.splitlines()
        assert lines[1].split()[:5] == ["tenant", "model", "family", "affected", "block"]
        assert lines[2].split()[0] == "clock" and lines[2].split()[4] == "0" and len(lines) == 3
        assert "clean" not in table
        refused = subprocess.run(
            [sys.executable, "-m", "gateway", "prefix-report", gateway.url, "--admin-key", CLOCK],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=ROOT,
        )
        assert refused.returncode == 1 and f"403 from {gateway.url}" in refused.stderr  # not an admin key

        gateway.rewrite({**gateway.data, "logging": {"prompts": True}})
        reloaded = httpx.post(f"{gateway.url}/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5)
        assert reloaded.status_code == 200, reloaded.text
        ask(gateway, CLOCK, "Current time: 2026-12-04T20:00:09Z", 9)
        eventually(lambda: report(gateway)["analysed_requests"] == 7)
        assert report(gateway)["families"][0]["around"].endswith("time: 2026-12-04T20:00:09Z\n")
        assert (
            httpx.get(
                f"{gateway.url}/admin/prefix-report", headers={"Authorization": f"Bearer {CLOCK}"}, timeout=5
            ).status_code
            == 403
        )
