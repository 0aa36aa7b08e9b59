"""`headers.session`: the session key's header name is configurable (default `X-Session-ID`)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.routing.policies.session_affinity import home_replica
from tests.integration.gateway_procs import MODEL, pool, running, start_gateway, start_stub

pytestmark = pytest.mark.timeout(60)


def test_a_configured_session_header_keys_session_affinity(tmp_path: Path) -> None:
    with running() as track:
        stubs = [track(start_stub(f"s-{i}")) for i in range(3)]
        ids = [s.replica_id for s in stubs]
        gateway = track(
            start_gateway(
                tmp_path,
                {MODEL: pool(*((s.replica_id, s.url) for s in stubs), policy="session_affinity")},
                headers={"session": "X-Conversation"},
            )
        )
        with httpx.Client(base_url=gateway.url, timeout=10) as http:
            for key in ("alpha", "beta", "gamma", "delta", "epsilon", "zeta"):
                for turn in range(2):
                    answer = http.post(
                        "/v1/completions",
                        headers={"X-Conversation": key},
                        json={"model": MODEL, "prompt": f"turn {turn} of {key}", "max_tokens": 1},
                    )
                    assert answer.status_code == 200
                    assert answer.headers["X-Replica-Id"] == home_replica(key, ids), (key, turn)


def test_a_bad_session_header_name_is_a_config_error(tmp_path: Path) -> None:
    from gateway.config.loader import parse_config
    from gateway.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_config({"pools": {MODEL: pool(("a", "http://h:1"))}, "headers": {"session": "bad header"}})
    assert err.value.key == "headers.session"
