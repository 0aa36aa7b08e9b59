"""Client disconnects in each of the three phases, read off the replica's own running count.

The client is a raw socket, so the moment it closes is exact; the replica stub's
`vllm:num_requests_running` must drop to 0 within 100 ms of it, and the gateway's in-flight
count must be 0 afterwards.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.gateway_procs import MODEL, Gateway, Stub, pool, running, start_gateway, start_stub
from tests.integration.reliability_tools import chat, eventually, replica_running

pytestmark = pytest.mark.timeout(60)
ABORT_WITHIN_S = 0.1
PREFILL_MS = 1500  # one prefill step of the stub at speedup 1: a wide window to disconnect inside


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Stub]]:
    with running() as track:
        stub = track(start_stub("slow", MODEL, 1, "--prefill-base-ms", str(PREFILL_MS)))
        gateway = track(start_gateway(tmp_path_factory.mktemp("cancel"), {MODEL: pool(("slow", stub.url))}))
        yield gateway, stub


def _send(gateway: Gateway, body: dict[str, object]) -> socket.socket:
    raw = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", gateway.port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw
    )
    return sock


def _abort_seen_after(sock: socket.socket, stub: Stub) -> float:
    """Close the client socket; seconds until the replica no longer runs the request."""
    with httpx.Client(timeout=2) as http:
        sock.close()
        closed = time.perf_counter()
        while replica_running(stub, http):
            assert time.perf_counter() - closed < 5, "the replica never aborted the request"
        return time.perf_counter() - closed


def _wait_running(stub: Stub) -> None:
    with httpx.Client(timeout=2) as http:
        eventually(lambda: replica_running(stub, http) == 1, timeout_s=5, interval_s=0.005)


@pytest.mark.parametrize("phase", ["prefill", "non_streaming", "mid_stream"])
def test_disconnect_aborts_the_replica_within_100ms(cluster: tuple[Gateway, Stub], phase: str) -> None:
    gateway, stub = cluster
    sock = _send(gateway, chat("tell me a long story", max_tokens=400, stream=phase != "non_streaming"))
    _wait_running(stub)
    if phase == "mid_stream":
        sock.settimeout(5)
        received = b""
        while b"data: " not in received:
            received += sock.recv(65536)
    else:
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            sock.recv(1)  # not one byte reached the client yet (still in prefill / whole-body wait)
    elapsed = _abort_seen_after(sock, stub)
    print(f"\nRELIABILITY cancel {phase}: replica running count 0 after {elapsed * 1000:.1f} ms")
    assert elapsed < ABORT_WITHIN_S
    eventually(lambda: gateway.replicas()["slow"]["in_flight"] == 0, timeout_s=2)


def test_half_closed_client_is_taken_as_gone_pinned_known_limit(cluster: tuple[Gateway, Stub]) -> None:
    """Known limit (RELIABILITY.md): a FIN after the request reads as a disconnect, so the request is
    cancelled like any other: no answer, logged 499, the replica aborts it, nothing hangs."""
    gateway, stub = cluster
    raw = json.dumps(chat("tell me a long story", max_tokens=400)).encode()
    sock = socket.create_connection(("127.0.0.1", gateway.port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        b"X-Request-Id: half-closed-1\r\nContent-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw
    )
    _wait_running(stub)
    sock.shutdown(socket.SHUT_WR)
    closed = time.perf_counter()
    with httpx.Client(timeout=2) as http:
        while replica_running(stub, http):
            assert time.perf_counter() - closed < 5, "the replica never aborted the request"
    elapsed = time.perf_counter() - closed
    sock.settimeout(5)
    assert sock.recv(65536) == b"", "the gateway closed the connection without an answer"
    sock.close()
    eventually(lambda: gateway.replicas()["slow"]["in_flight"] == 0, timeout_s=2)
    lines = [json.loads(line) for line in gateway.proc.output().splitlines() if "half-closed-1" in line]
    print(f"\nRELIABILITY cancel half_close: replica aborted after {elapsed * 1000:.1f} ms; log {lines[-1:]}")
    assert elapsed < ABORT_WITHIN_S
    assert any(line.get("status") == 499 for line in lines), lines
