"""Aliases, patterns and the default pool through a real gateway in front of real stubs: the stub
serves only its own model name, so an answer proves the body reached it under the pool's name."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.integration.gateway_procs import MODEL, running, start_gateway, start_stub

pytestmark = pytest.mark.timeout(60)


def test_aliases_patterns_and_the_default_pool_reach_the_pool(tmp_path: Path) -> None:
    with running() as track:
        stub = track(start_stub("s-0"))
        other = track(start_stub("o-0", "other-model"))
        pools = {
            MODEL: {"replicas": [{"url": stub.url, "name": "s-0"}], "aliases": ["gpt-4o-mini", "stub-*"]},
            "other-model": {"replicas": [{"url": other.url, "name": "o-0"}]},
        }
        gateway = track(start_gateway(tmp_path, pools, routes={"default_pool": "other-model"}))
        with httpx.Client(base_url=gateway.url, timeout=10) as http:
            for name, replica in (("gpt-4o-mini", "s-0"), ("stub-v2", "s-0"), ("nobody-knows", "o-0")):
                answer = http.post(
                    "/v1/chat/completions",
                    json={"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                )
                assert answer.status_code == 200, (name, answer.text)
                assert answer.headers["X-Replica-Id"] == replica
                assert answer.json()["model"] == (MODEL if replica == "s-0" else "other-model")
            listed = [m["id"] for m in http.get("/v1/models").json()["data"]]
            assert sorted(listed) == sorted([MODEL, "gpt-4o-mini", "other-model"])  # patterns are not names
            metrics = http.get("/metrics").text
            assert 'model_name="gpt-4o-mini"' not in metrics and 'model_name="nobody-knows"' not in metrics
            assert f'model_name="{MODEL}"' in metrics  # the pool's name is what the series carry


def test_without_a_default_an_unknown_model_is_404_naming_the_served_ones(tmp_path: Path) -> None:
    with running() as track:
        stub = track(start_stub("s-0"))
        gateway = track(
            start_gateway(
                tmp_path, {MODEL: {"replicas": [{"url": stub.url, "name": "s-0"}], "aliases": ["gpt-4o-mini"]}}
            )
        )
        answer = httpx.post(f"{gateway.url}/v1/completions", json={"model": "gpt-4", "prompt": "x"}, timeout=10)
        assert answer.status_code == 404
        assert answer.json()["error"]["param"] == "model" and MODEL in answer.json()["error"]["message"]
