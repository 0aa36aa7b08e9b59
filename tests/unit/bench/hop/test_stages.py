"""The stage breakdown charges each py-spy sample to the innermost frame of the gateway's own code."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.hop.stages import FRAMEWORK, attribute, stage_of

pytestmark = pytest.mark.timeout(10)

AROUND = "main (gateway/cli/main.py:44);serve (gateway/serving/lifecycle.py:57);Runner.run (asyncio/runners.py:118)"


def test_a_frame_is_staged_by_its_module_and_function() -> None:
    assert stage_of("choose", "gateway/routing/policies/prefix_affinity.py") == "policy"
    assert stage_of("edge_middleware", "/srv/app/gateway/serving/app.py") == "limits and auth"
    assert stage_of("_proxied", "gateway/serving/app.py") == "request bookkeeping"
    assert stage_of("serve", "gateway/serving/lifecycle.py") is None  # around every request
    assert stage_of("_request", "aiohttp/client.py") is None


def test_samples_go_to_the_innermost_frame_of_ours_with_the_libraries_it_called(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(
        f"{AROUND};RequestHandler.start (aiohttp/web_protocol.py:1) 5\n"
        f"{AROUND};_proxied (gateway/serving/app.py:172);choose (gateway/routing/policies/prefix_affinity.py:9) 3\n"
        f"{AROUND};_send_once (gateway/relay/proxy.py:1);ClientSession._request (aiohttp/client.py:2) 2\n"
    )
    stages, functions, total = attribute(raw)
    assert total == 10
    assert stages[(FRAMEWORK, False)] == 5
    assert stages[("policy", True)] == 3
    assert stages[("relay", False)] == 2  # aiohttp's client, called from the relay's own frame
    assert functions.most_common(1) == [("choose (gateway/routing/policies/prefix_affinity.py)", 3)]
