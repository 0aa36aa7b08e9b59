"""One KV-event subscription per replica for all the workers of `serve --workers N`.

Why: every worker is a whole gateway, and each used to open its own SUB connection to every replica's
PUB socket, so N workers cost a replica N copies of its event stream. Now worker 0 (the owner, as for
the shared monitor: `gateway.replicas.shared_monitor`) is the only one subscribed to the replica; its
subscriber hands every multipart message its SUB socket receives, unchanged, to a `Forwarder` (a PUB
socket on an IPC name private to the supervisor) before applying it to its own tables, and the other
workers (followers) subscribe to that name instead of the replica's endpoint. The replica sees one
subscriber whatever N. Each follower still decodes and applies every batch to its own exact tables, so
routing is the same in every worker, and its replay requests still go to the replica's replay socket:
replays happen at a feed's start and after a gap only, a handful per worker.

The name is a pure function of the supervisor (its group) and of the feed (model, replica id, endpoint,
topic), hashed (`Sharing.feed`): every worker finds it without asking, whatever order its discovery or
reloads built its feeds in. It is an abstract Unix socket (`ipc://@...`, Linux), as the workers' own
sockets are: nothing on disk, gone with the process that bound it. With one worker there is no `Sharing`,
no forwarder and no relay at all.

Trade-offs, all covered by the subscriber's certainty rules (`gateway.index.kv_events.subscriber`):
- While the owner restarts, followers hear silence: the batches published meanwhile never reach them.
  The owner's next forwarded batch shows each follower a gap (or a restart), which it fills from the
  replica's replay socket as after any outage; until then a follower's table lags the replica, as a
  single gateway's does through a network partition, and a table that misses a finished request's new
  blocks turns itself uncertain (`gateway.index.exact`).
- A feed one worker has and the owner has not (a reload sent to one worker only with `/admin/reload`,
  a replica its discovery found first) listens on a name nobody binds: the same silence, until the
  owner has that feed too.
- A follower gets a batch one local hop after the owner read it. The owner forwards before applying,
  but reads its next batch only after applying this one (paced: `gateway.support.pacing`), so a flood
  reaches followers at the owner's pace.
- The forwarder never blocks the owner: a follower that falls behind by ZMQ's high-water mark (1,000
  messages) loses batches, sees the gap and replays.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import structlog
import zmq
import zmq.asyncio

from gateway.config.pools import KVEventsConfig

log = structlog.get_logger("gateway.index.kv_events.relay")

REBIND_S = 0.1  # a name still held is tried again at most this often, at the next batch to forward
WARN_AFTER_S = 2.0  # held this long, it is worth a warning: a replaced feed's forwarder lets go within milliseconds


@dataclass(frozen=True)
class FeedRelay:
    """One feed's part in the sharing: the owner's feed forwards to `endpoint`, a follower's reads from it."""

    endpoint: str
    forwards: bool

    def describe(self) -> dict[str, str]:
        return {"role": "forwards" if self.forwards else "follows", "endpoint": self.endpoint}


@dataclass(frozen=True)
class Sharing:
    """This worker's side of the sharing: `group` names the supervisor (`gateway.serving.workers.WorkerSpec`),
    `owner` says whether this worker subscribes to the replicas and forwards."""

    group: str
    owner: bool

    def feed(self, model: str, replica_id: str, config: KVEventsConfig) -> FeedRelay:
        """The same name in every worker for the same feed; another feed (a changed endpoint or topic
        included) gets another, so a follower never reads a stream its config does not name."""
        key = "\0".join((model, replica_id, config.endpoint, config.topic)).encode()
        digest = hashlib.blake2b(key, digest_size=8).hexdigest()
        return FeedRelay(f"ipc://@{self.group}-kv-{digest}", self.owner)


class Forwarder:
    """The owner's PUB socket for one feed: `send` passes a received message on to the followers."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str) -> None:
        # A plain socket on the same ZMQ context: a non-blocking send needs no future. It is not the
        # asyncio context's own, so `close()` must come before that context is destroyed.
        self.endpoint = endpoint
        self.forwarded = 0  # messages passed on
        self.unbound = 0  # messages dropped while the name could not be bound
        self._pub = zmq.Context.shadow(ctx.underlying).socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._bound = self._warned = False
        self._retry_at = 0.0
        self._since = time.monotonic()
        self._bind()

    def _bind(self) -> bool:
        """Bind the name, unless tried less than `REBIND_S` ago. A feed replaced by a reload or a new router
        gets a forwarder on the same name at once, and ZMQ closes the old socket a moment later, in its I/O
        thread: a first bind that fails is usual, and what it costs is a gap the followers replay."""
        now = time.monotonic()
        if now < self._retry_at:
            return False
        try:
            self._pub.bind(self.endpoint)
        except zmq.ZMQError as exc:
            if not self._warned and now - self._since >= WARN_AFTER_S:
                self._warned = True
                log.warning(
                    "kv_events_relay_bind_failed",
                    endpoint=self.endpoint,
                    error=str(exc),
                    for_s=round(now - self._since, 1),
                )
            self._retry_at = now + REBIND_S
            return False
        self._bound = True
        log.info("kv_events_relay_bound", endpoint=self.endpoint)
        return True

    def send(self, frames: list[bytes]) -> None:
        """Pass one message on as it came; never blocks (PUB drops for a subscriber at its high-water mark)."""
        if not self._bound and not self._bind():
            self.unbound += 1
            return
        self._pub.send_multipart(frames, flags=zmq.NOBLOCK)
        self.forwarded += 1

    def describe(self) -> dict[str, int]:
        return {"forwarded": self.forwarded, "unbound": self.unbound}

    def close(self) -> None:
        self._pub.close(linger=0)
