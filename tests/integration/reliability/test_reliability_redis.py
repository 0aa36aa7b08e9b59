"""Redis outages under load, with the shared warm-prefix index: zero failed requests.

The test's own redis-server is first frozen (SIGSTOP: every call times out) and then killed
(SIGKILL: connections refused) and restarted on its port, while clients keep sending. The gateway
answers from its local table meanwhile, says so on /ready and /metrics, and reconnects by itself
(its mirror of the tables resubscribes and reloads).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.gateway_procs import MODEL, pool, running, start_gateway, start_stub
from tests.integration.reliability_tools import Outcome, RedisServer, chat, eventually, metric, report

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]
CLIENTS = 4
DEGRADED = 'affinity_gateway_index_degraded{model_name="stub-model"}'
MIRRORED = 'affinity_gateway_index_mirror_synced{model_name="stub-model"}'


def _degraded(url: str) -> bool:
    answer = httpx.get(f"{url}/ready", timeout=5)
    assert answer.status_code == 200, "a degraded index is still ready"
    return answer.json()["degraded"] == {"index": [MODEL]}


def test_redis_frozen_then_killed_and_restarted_under_load(tmp_path: Path) -> None:
    redis_server = RedisServer().start()
    outcomes: list[Outcome] = []
    stop = threading.Event()

    def client(n: int, url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            i = 0
            while not stop.is_set():
                i += 1
                prompt = f"system prompt {n % 2} " * 20 + f"turn {i}"
                out = Outcome()
                try:
                    resp = http.post("/v1/chat/completions", json=chat(prompt, max_tokens=2))
                    out.status, out.body = resp.status_code, resp.content
                except httpx.HTTPError as exc:
                    out.error = f"{type(exc).__name__}: {exc}"
                outcomes.append(out)

    try:
        with running() as track:
            stubs = [track(start_stub(f"replica-{i}", speedup=20)) for i in range(2)]
            routing = {
                "replicas": pool(*((s.replica_id, s.url) for s in stubs))["replicas"],
                "routing": {"policy": "prefix_affinity"},
            }
            gateway = track(
                start_gateway(
                    tmp_path,
                    {MODEL: routing},
                    redis={"url": redis_server.url},
                    index={"store": "redis", "timeout_s": 0.05, "reconnect_max_s": 0.3},
                )
            )
            threads = [threading.Thread(target=client, args=(n, gateway.url)) for n in range(CLIENTS)]
            for t in threads:
                t.start()
            time.sleep(1.0)
            assert not _degraded(gateway.url)
            assert metric(gateway, MIRRORED) == 1.0  # lookups answer from the mirror
            redis_server.pause(True)  # hung: every call runs into the 50 ms timeout
            eventually(lambda: _degraded(gateway.url), timeout_s=5)
            assert metric(gateway, DEGRADED) == 1.0
            time.sleep(1.0)
            redis_server.pause(False)
            eventually(lambda: not _degraded(gateway.url), timeout_s=10)
            redis_server.kill()  # gone: connections refused
            eventually(lambda: _degraded(gateway.url), timeout_s=5)
            time.sleep(1.5)
            redis_server.start()  # same port, empty: the gateway reconnects and refills it
            # /ready and /metrics read the flag at different moments; under CI load one slow
            # lookup (50 ms timeout) can flip it back for a probe interval, so wait for both.
            eventually(lambda: not _degraded(gateway.url) and metric(gateway, DEGRADED) == 0.0, timeout_s=10)
            eventually(lambda: metric(gateway, MIRRORED) == 1.0, timeout_s=10)  # resubscribed and reloaded
            time.sleep(0.5)
            stop.set()
            for t in threads:
                t.join(30)
            fallbacks = metric(gateway, 'affinity_gateway_index_fallback_total{model_name="stub-model"}')
    finally:
        stop.set()
        redis_server.stop()
    report("redis frozen then killed and restarted", outcomes, index_fallback_lookups=fallbacks)
    assert len(outcomes) > 50
    failed = [o for o in outcomes if not o.clean]
    assert not failed, failed[:3]
