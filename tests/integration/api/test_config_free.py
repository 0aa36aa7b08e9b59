"""`affinity-gateway serve --replica URL --model NAME` as a real process: no config file at all."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers import Proc, free_port, python_module, wait_http
from tests.integration.gateway_procs import MODEL, running, start_stub

pytestmark = pytest.mark.timeout(60)


def test_serve_from_flags_routes_to_the_named_replicas() -> None:
    with running() as track:
        stubs = [track(start_stub(f"flag-{i}")) for i in range(2)]
        port = free_port()
        proc = Proc(
            python_module(
                "gateway",
                "serve",
                "--replica",
                stubs[0].url,
                "--replica",
                stubs[1].url,
                "--model",
                MODEL,
                "--policy",
                "round_robin",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            )
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http(f"{url}/ready", proc)
            seen = set()
            for _ in range(4):
                answer = httpx.post(
                    f"{url}/v1/chat/completions",
                    timeout=10,
                    json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                )
                assert answer.status_code == 200, answer.text
                seen.add(answer.headers["X-Replica-Id"])
            assert seen == {s.url.removeprefix("http://") for s in stubs}  # names default to host:port
            reload = httpx.post(f"{url}/admin/reload", timeout=5)
            assert reload.status_code == 400 and "without a config file" in reload.json()["error"]["message"]
        finally:
            proc.stop()
