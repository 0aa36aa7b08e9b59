"""The live dashboard in a real browser: a gateway with auth and three replica stubs, one request, then
/dashboard opened in headless Chromium (Debian's `chromium`, driven over the DevTools protocol) shows every
replica's row and that request's routing decision with its candidates' scores. The page and its assets
need no key; the admin routes it polls do (the page takes it from its #key= fragment).
`DASHBOARD_SCREENSHOT=docs/dashboard.png` saves what the browser shows."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from gateway.edge.auth import hash_key
from tests.helpers import Proc, free_port, must_run_redis
from tests.integration.gateway_procs import MODEL, pool, running, start_gateway, start_stub

pytestmark = pytest.mark.timeout(90)
ADMIN, USER = "sk-admin-dashboard-01", "sk-user-dashboard-23"
KEYS = [{"sha256": hash_key(ADMIN), "tenant": "ops", "admin": True}, {"sha256": hash_key(USER), "tenant": "app"}]
SHOWN = """JSON.stringify({
  replicas: [...document.querySelectorAll('#replicas tbody tr')].map(r => r.dataset.replica),
  decisions: [...document.querySelectorAll('#decisions tr.decision')].map(r => r.dataset.request),
  candidates: [...document.querySelectorAll('#decisions tr.decision td:last-child span span')].map(s => s.textContent),
  status: document.getElementById('status').textContent})"""


class DevTools:
    """One page's DevTools websocket: send a method, wait for the answer with its id."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.ids = ws, itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self.ids)
        await self.ws.send_json({"id": call_id, "method": method, "params": params})
        while True:
            message = json.loads((await self.ws.receive(timeout=20)).data)
            if message.get("id") == call_id:
                assert "error" not in message, message
                return message["result"]


async def page_ws(port: int) -> str:
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            try:
                async with http.get(f"http://127.0.0.1:{port}/json/list") as answer:
                    pages = [t for t in await answer.json() if t["type"] == "page"]
                    if pages:
                        return str(pages[0]["webSocketDebuggerUrl"])
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError("chromium's DevTools endpoint never answered")


async def watch_dashboard(port: int, expected_replicas: set[str], request_id: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.ws_connect(await page_ws(port), max_msg_size=0) as ws:
        tools = DevTools(ws)
        shown: dict[str, Any] = {}
        for _ in range(300):  # about 30 s on a loaded machine
            result = await tools.call("Runtime.evaluate", expression=SHOWN, returnByValue=True)
            if "exceptionDetails" not in result:  # else the page is still loading
                shown = json.loads(result["result"]["value"])
                if set(shown["replicas"]) == expected_replicas and request_id in shown["decisions"]:
                    break
            await asyncio.sleep(0.1)
        if target := os.environ.get("DASHBOARD_SCREENSHOT"):
            await tools.call(
                "Emulation.setDeviceMetricsOverride", width=1280, height=1000, deviceScaleFactor=1, mobile=False
            )
            await asyncio.sleep(1.5)  # a poll or two at the new size
            shot = await tools.call("Page.captureScreenshot", format="png")
            Path(target).write_bytes(base64.b64decode(shot["data"]))
        return shown


def test_the_dashboard_shows_every_replica_and_the_latest_decision(tmp_path: Path) -> None:
    browser = shutil.which("chromium")
    if browser is None:
        if must_run_redis():  # CI=true: the browser tests must run too
            pytest.fail("chromium not found and CI=true")
        pytest.skip("chromium not installed (apt-get install chromium)")
    with running() as track:
        stubs = [track(start_stub(f"r-{i}")) for i in range(3)]
        gateway = track(
            start_gateway(
                tmp_path,
                {MODEL: pool(*((s.replica_id, s.url) for s in stubs), policy="prefix_affinity")},
                auth={"keys": KEYS},
            )
        )
        for path in ("/dashboard", "/dashboard/dashboard.js", "/dashboard/dashboard.css"):
            assert httpx.get(gateway.url + path, timeout=5).status_code == 200  # no key for the page itself
        assert httpx.get(gateway.url + "/admin/decisions", timeout=5).status_code == 401
        for turn in range(3):
            answer = httpx.post(
                f"{gateway.url}/v1/chat/completions",
                timeout=20,
                headers={"Authorization": f"Bearer {USER}", "X-Request-Id": f"dash-probe-{turn}"},
                json={
                    "model": MODEL,
                    "max_tokens": 4,
                    "stream": True,
                    "messages": [{"role": "user", "content": f"Plan leg {turn} of the trip."}],
                },
            )
            assert answer.status_code == 200
        port = free_port()
        chrome = Proc(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                f"--user-data-dir={tmp_path / 'chromium'}",
                f"--remote-debugging-port={port}",
                "--remote-allow-origins=*",
                f"{gateway.url}/dashboard#key={ADMIN}",
            ]
        )
        try:
            shown = asyncio.run(watch_dashboard(port, {s.replica_id for s in stubs}, "dash-probe-2"))
        finally:
            chrome.stop()
    assert set(shown["replicas"]) == {"r-0", "r-1", "r-2"}, shown
    assert shown["decisions"][:3] == ["dash-probe-2", "dash-probe-1", "dash-probe-0"], shown
    assert any(text.startswith("r-") for text in shown["candidates"]), shown  # each candidate's score
    assert shown["status"].startswith("updated"), shown
