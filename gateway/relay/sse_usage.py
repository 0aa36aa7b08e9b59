"""The usage event of a relayed stream, found without touching or delaying the bytes: see
`gateway.request.usage` for what is read from it."""

from __future__ import annotations

from gateway.request.usage import Usage

_MAX_TAIL_BYTES = 1 << 20  # an SSE event larger than this is not scanned
_BATCH_BYTES = 1 << 16  # streamed bytes scanned together


class SSEUsageScanner:
    """Feed it every relayed chunk, `flush()` it once the stream is over. Chunks are read in batches (of
    `_BATCH_BYTES`, and the rest at `flush()`): a short stream is split into events and parsed once, at its
    end, where a scan per chunk cost more than the relay itself. Between batches it keeps only the
    unfinished last event."""

    def __init__(self, usage: Usage) -> None:
        self.usage = usage
        self._tail = b""
        self._chunks: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> None:
        if (
            self.usage.answer is None
            and not self._chunks
            and not self._tail
            and chunk.endswith(b"\n\n")
            and _no_usage(chunk)
        ):
            return  # whole events, none with a usage to read (vLLM's every event but the last): nothing to keep
        self._chunks.append(chunk)
        self._size += len(chunk)
        if self._size >= _BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Read what was fed since the last batch (an unfinished last event waits for more, or stays unread)."""
        if not self._chunks:
            return
        data = b"".join((self._tail, *self._chunks))
        self._chunks.clear()
        self._size = 0
        end = data.rfind(b"\n\n")
        if end < 0:
            self._tail = data if len(data) <= _MAX_TAIL_BYTES else b""
            return
        self._tail = data[end + 2 :]
        complete = data[:end]
        collect = self.usage.answer is not None
        if not collect and _no_usage(complete):
            return
        self.usage.read_events(_data_lines(complete) if collect else _usage_data(complete))


def _data_lines(events: bytes) -> list[bytes]:
    """Every event's data. vLLM writes each event as one `data: ` line: those are split in one pass, where
    the general form (several lines, comments, other fields) is split event by event."""
    if events.startswith(b"data: ") and events.count(b"\n") == 2 * events.count(b"\n\ndata: "):
        return [data.strip() for data in events[6:].split(b"\n\ndata: ")]
    return _data_of(events.split(b"\n\n"))


def _usage_data(events: bytes) -> list[bytes]:
    """The data of the events that carry a usage."""
    return _data_of([event for event in events.split(b"\n\n") if b'"usage"' in event and b'"usage":null' not in event])


def _data_of(events: list[bytes]) -> list[bytes]:
    """The `data:` lines of these events, without the field name."""
    return [line[5:].strip() for event in events for line in event.split(b"\n") if line.startswith(b"data:")]


def _no_usage(events: bytes) -> bool:
    """No event here has a usage to read: each one that names it says null (vLLM's every event but the last)."""
    return events.count(b'"usage"') == events.count(b'"usage":null')
