"""Backend credentials through real processes: a stub started with `--api-key` behind the gateway."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.edge.auth import hash_key
from tests.integration.gateway_procs import MODEL, pool, running, start_gateway, start_stub

pytestmark = pytest.mark.timeout(60)
BACKEND_KEY = "backend-secret-1"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def test_keyed_stub_answers_401_in_vllm_shape_without_the_key() -> None:
    with running() as track:
        stub = track(start_stub("keyed-0", MODEL, 50, "--api-key", BACKEND_KEY))
        bare = httpx.post(f"{stub.url}/v1/chat/completions", json=CHAT, timeout=10)
        assert bare.status_code == 401 and bare.json() == {"error": "Unauthorized"}
        keyed = httpx.post(
            f"{stub.url}/v1/chat/completions", json=CHAT, timeout=10, headers={"Authorization": f"Bearer {BACKEND_KEY}"}
        )
        assert keyed.status_code == 200
        assert httpx.get(f"{stub.url}/health", timeout=5).status_code == 200  # probes stay open, as in vLLM


def test_gateway_sends_the_pool_key_from_env_and_never_the_clients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AG_TEST_BACKEND_KEY", BACKEND_KEY)  # the gateway process inherits it
    with running() as track:
        stub = track(start_stub("keyed-0", MODEL, 50, "--api-key", BACKEND_KEY))
        gateway = track(
            start_gateway(tmp_path, {MODEL: {**pool(("keyed-0", stub.url)), "api_key_env": "AG_TEST_BACKEND_KEY"}})
        )
        # The client's own bearer is not the replica's: forwarded, it would get 401.
        answer = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json=CHAT,
            timeout=10,
            headers={"Authorization": "Bearer the-clients-own-key"},
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 3
        models = httpx.get(f"{gateway.url}/v1/models", timeout=10).json()["data"]
        assert models[0]["max_model_len"] > 0  # the model card was fetched with the key too


def test_replica_key_file_wins_and_gateway_auth_still_strips_the_client_key(tmp_path: Path) -> None:
    key_file = tmp_path / "replica.key"
    key_file.write_text(BACKEND_KEY + "\n")
    client_key = "gateway-client-key"
    with running() as track:
        stub = track(start_stub("keyed-0", MODEL, 50, "--api-key", BACKEND_KEY))
        pools = {
            MODEL: {
                "replicas": [{"url": stub.url, "name": "keyed-0", "api_key_file": str(key_file)}],
                "routing": {"policy": "round_robin"},
            }
        }
        gateway = track(
            start_gateway(tmp_path, pools, auth={"keys": [{"sha256": hash_key(client_key), "tenant": "t"}]})
        )
        answer = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json=CHAT,
            timeout=10,
            headers={"Authorization": f"Bearer {client_key}"},
        )
        assert answer.status_code == 200, answer.text


def test_a_pool_without_the_key_passes_the_replicas_401_on(tmp_path: Path) -> None:
    with running() as track:
        stub = track(start_stub("keyed-0", MODEL, 50, "--api-key", BACKEND_KEY))
        gateway = track(start_gateway(tmp_path, {MODEL: pool(("keyed-0", stub.url))}))
        answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT, timeout=10)
        assert answer.status_code == 401 and answer.json() == {"error": "Unauthorized"}
