"""Bounds on what a KV-event publisher sends, over real ZMQ sockets on loopback: sequence numbers out of
vLLM's range, a table told of more blocks than the replica holds, and batches too large to decode on the
event loop in one go."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import structlog

from gateway.log import setup_logging
from tests.unit.gateway.index.kv_events.test_subscriber import FakePublisher, publisher, stored, subscribe, until

pytestmark = pytest.mark.timeout(30)
__all__ = ["publisher"]  # the fixture, used by name


@pytest.fixture
def json_logs() -> Iterator[None]:
    """The gateway's own log set-up (orjson renders every event, as in production)."""
    setup_logging("info", "json")
    yield
    structlog.reset_defaults()


async def test_a_seq_out_of_range_is_refused_without_ending_the_session(
    publisher: FakePublisher, json_logs: None, capfd: pytest.CaptureFixture[str]
) -> None:
    sub, sink = await subscribe(publisher)
    try:
        await publisher.publish(stored(1))
        await until(lambda: sub.last_seq == 0)
        await publisher.pub.send_multipart([b"kv-events", (2**64 - 1).to_bytes(8, "big"), b"\x90"])
        publisher.seq = 1
        await publisher.publish(stored(2, parent=1))
        await publisher.publish(stored(3, parent=2))
        await asyncio.sleep(0.2)  # whatever the subscriber did with the bad seq is done
        await publisher.publish(stored(4, parent=3))
        await until(lambda: sub.last_seq == 3)
        err = capfd.readouterr().err
        assert "kv_events_error" not in err and "Traceback" not in err, err[-2000:]
        assert sub.decode_errors == 1 and sub.resets == 0
        assert sink.calls[-1] == ("stored", "r1", (4,), 3)
    finally:
        await sub.close()
