"""Exact warm-prefix tables, fed by the replicas' own KV events, plus speculative entries.

The top rungs of the evidence ladder (see `gateway.routing.router`). A replica that publishes KV
events (`gateway.index.kv_events.subscriber`) tells us every block it stores and evicts, with the block's
token ids. We never reproduce the engine's block hashes (they depend on its hash algorithm
and PYTHONHASHSEED): each stored block gets the gateway's own chain key, computed from its
token ids exactly as `gateway.prompt.prefix_keys` keys a token-exact request, seeded with its parent's own
key, and an engine-hash → own-key map turns later removals into our keys (dual keys).
A chain of a LoRA adapter's blocks starts from that adapter's seed (the event's `lora_name`), as a
request naming the adapter is keyed, so blocks of different adapters never answer each other's lookups.

Events arrive after the replica has run the prefill. Between dispatch and the event, a burst
of sibling requests would see nothing: `speculate` inserts the dispatched request's blocks
until their BlockStored arrives, and a lookup counts a block as held if the events or an
unexpired speculation say so. The bound follows the replica: `PREFILL_MULTIPLE` times its
observed time to first token (an EWMA of the requests that finished there), never less than
`speculative_ttl_s` (the value before any observation). A CPU prefill takes seconds, a GPU's
milliseconds; a fixed 2 s expired before a CPU replica had stored anything.

A request dispatched with blocks the table lacks, and then one that filled a new block finishing
there, mean the replica has published a BlockStored since. When no event at all has arrived since
that dispatch, and the window passes after that finish, the publisher is not reaching us (vLLM
given a non-wildcard endpoint connects its PUB socket instead of binding it, while its replay
socket binds, so a replay succeeds and live batches never come): the table turns uncertain with
a warning saying so, until an event arrives.

A table is *certain* when it is known to mirror the replica's cache (the subscriber saw its
whole event history); an uncertain table still answers, and the router takes the larger of
it and the routing-history estimate.

A table holds at most its replica's KV capacity in blocks (`set_capacity`: the replica's
`num_gpu_blocks`, once known), else `DEFAULT_CAPACITY_BLOCKS`: a publisher naming more blocks than the
replica can hold (one naming 1.4 M blocks for a capacity of 4,096 cost 340 MB) is lying or lost its
removals. The oldest stored blocks then make room, and the table is uncertain until its next
start-over (`cleared`): the router takes the larger of it and the routing history, as for any
uncertain table.

With a shared (Redis) store, stored blocks are also written to the replica's history table
(`share`): a gateway whose own feed is uncertain, or that has none, then sees what the replica
stored even for requests that never went through any gateway. Removals are not written: the
history table's capacity trim and TTL age blocks out, as they do for routed requests.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from gateway.prompt.prefix_keys import adapter_seed, chain_hash_tokens

log = structlog.get_logger("gateway.index.exact")

EngineHash = int | bytes
EVENTS, SPECULATIVE = "events", "speculative"
PREFILL_MULTIPLE = 4.0  # the events window, in observed times to first token
TTFT_WEIGHT = 0.2  # EWMA weight of the newest observation
# A replica's table before its KV capacity is known: index.capacity_blocks' default (1 Mi tokens of 16)
DEFAULT_CAPACITY_BLOCKS = 65536


@dataclass(slots=True)
class _Table:
    # engine hash -> our chain key, oldest stored first (an OrderedDict drops its oldest in O(1), a dict
    # popped from the front scans its dead slots: a table kept at capacity cost 3x the flood's time)
    own_key: OrderedDict[EngineHash, int] = field(default_factory=OrderedDict)
    held: dict[int, int] = field(default_factory=dict)  # our key -> engine blocks holding it (1 nearly always)
    speculative: dict[int, float] = field(default_factory=dict)  # our key -> expiry (monotonic seconds)
    next_sweep: float = 0.0
    certain: bool = False
    orphans: int = 0  # stored blocks whose parent we never saw: no key can name them
    ttft_s: float | None = None  # EWMA of observed times to first token there
    expecting_since: float | None = None  # a request with new blocks was sent there; no event since
    due_since: float | None = None  # ... and a request that filled a new block finished there since
    silent: bool = False  # events were due and did not come: uncertain until one does
    overflowed: bool = False  # more blocks were named than the replica holds: uncertain until cleared


class ExactTables:
    """Per-replica tables for replicas with a KV-event feed; implements `kv_events.EventSink`."""

    def __init__(
        self,
        root_seed: int,
        block_tokens: int,
        speculative_ttl_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        share: Callable[[str, Sequence[int]], object] | None = None,
        capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS,
    ) -> None:
        """`root_seed`: the chain seed of a request's first block (`prefix.model_seed`);
        `clock`: what speculative entries expire by (the simulator's virtual time there);
        `share`: called with each replica's newly stored keys (a shared index's `record`);
        `capacity_blocks`: a table's bound until `set_capacity` says the replica's own."""
        self.root_seed = root_seed
        self.clock = clock
        self.share = share
        self.block_tokens = block_tokens
        self.speculative_ttl_s = speculative_ttl_s
        self._tables: dict[str, _Table] = {}
        self._default_capacity = capacity_blocks
        self._capacity: dict[str, int] = {}
        self.overflows = 0  # blocks dropped to keep a table within its replica's capacity
        self.names_adapters = True  # False once a LoRA block came with an id and no name: see `_root`
        self.on_block_size: Callable[[str, int, str], None] = lambda replica_id, size, source: None  # the router's

    # -- what a subscriber feeds in (EventSink) --

    def _root(self, lora_id: int | None, lora_name: str | None) -> int:
        """A chain's first seed: the base model's, or its LoRA adapter's as a request for it is keyed
        (`prefix.adapter_seed`). An adapter known by its id alone (vLLM <= 0.11 sends no name, and says
        nowhere which name an id has) gets a seed of its own: its blocks stay apart, never predicted, and
        adapter requests are then predicted from the routing history instead (`names_adapters`)."""
        if lora_name is not None:
            return adapter_seed(self.root_seed, lora_name)
        if not lora_id:
            return self.root_seed
        self.names_adapters = False
        return adapter_seed(self.root_seed, f"\x00lora_id={lora_id}")

    def stored(
        self,
        replica_id: str,
        block_hashes: Sequence[EngineHash],
        parent: EngineHash | None,
        token_ids: Sequence[int],
        block_size: int,
        lora_id: int | None = None,
        lora_name: str | None = None,
    ) -> None:
        table = self._heard(replica_id)
        seed = self._root(lora_id, lora_name) if parent is None else table.own_key.get(parent)
        if seed is None:
            table.orphans += len(block_hashes)
            return
        if block_size != self.block_tokens:
            self.on_block_size(replica_id, block_size, "kv_events")
        most = self.capacity(replica_id)
        keys = chain_hash_tokens(token_ids, block_size, seed, len(block_hashes))
        for engine_hash, key in zip(block_hashes, keys):
            if engine_hash in table.own_key:
                continue  # at-least-once delivery: already counted
            if len(table.own_key) >= most:
                self._overflow(replica_id, table)
            table.own_key[engine_hash] = key
            table.held[key] = table.held.get(key, 0) + 1
            table.speculative.pop(key, None)  # confirmed: from now on the events say when it goes
        if self.share is not None and keys:
            self.share(replica_id, keys)

    def removed(self, replica_id: str, block_hashes: Sequence[EngineHash]) -> None:
        table = self._heard(replica_id)
        for engine_hash in block_hashes:
            key = table.own_key.pop(engine_hash, None)
            if key is not None:
                self._release(table, key)

    def cleared(self, replica_id: str) -> None:
        table = self._heard(replica_id)
        table.own_key.clear()
        table.held.clear()
        table.overflowed = False

    def set_capacity(self, replica_id: str, blocks: int) -> None:
        """The replica's KV cache holds `blocks` (its `num_gpu_blocks`): its table holds no more."""
        self._capacity[replica_id] = max(1, blocks)
        table = self._tables.get(replica_id)
        while table is not None and len(table.own_key) > self._capacity[replica_id]:
            self._overflow(replica_id, table)

    def capacity(self, replica_id: str) -> int:
        return self._capacity.get(replica_id, self._default_capacity)

    def _overflow(self, replica_id: str, table: _Table) -> None:
        """Drop the oldest stored block: the table was told of more than the replica can hold."""
        self._release(table, table.own_key.popitem(last=False)[1])
        self.overflows += 1
        if not table.overflowed:
            table.overflowed = True
            log.warning(
                "kv_events_over_capacity",
                replica=replica_id,
                capacity_blocks=self.capacity(replica_id),
                detail="the publisher named more blocks than the replica holds; the oldest are dropped and "
                "the table is uncertain until its next start-over",
            )

    @staticmethod
    def _release(table: _Table, key: int) -> None:
        left = table.held[key] - 1
        if left:
            table.held[key] = left
        else:
            del table.held[key]

    def set_certain(self, replica_id: str, certain: bool) -> None:
        self._table(replica_id).certain = certain

    # -- what the router asks --

    def covers(self, replica_id: str) -> bool:
        """Whether this replica has an event feed (a table, certain or not)."""
        return replica_id in self._tables

    def certain(self, replica_id: str) -> bool:
        table = self._tables.get(replica_id)
        if table is None or not table.certain or table.overflowed:
            return False
        since = table.due_since
        if not table.silent and since is not None and self.clock() - since > self._window(table):
            table.silent = True
            log.warning(
                "kv_events_silent",
                replica=replica_id,
                waited_s=round(self.clock() - since, 1),
                detail="requests finished there with new blocks but no KV event arrived; the table is "
                "uncertain until one does. Likely cause: the replica connects its PUB socket "
                "instead of binding it (vLLM binds only wildcard endpoints: give it tcp://*:PORT "
                "and the gateway tcp://<replica-host>:PORT), or the endpoint or topic is wrong",
            )
        return not table.silent

    def completed(self, replica_id: str, prompt_tokens: int, cached_tokens: int, ttft_s: float | None) -> None:
        """A request finished there: learn its time to first token; if its prompt filled a block
        beyond what was cached while a dispatch there is still unheard of, an event is due."""
        table = self._tables.get(replica_id)
        if table is None:
            return
        if ttft_s is not None and ttft_s > 0:
            table.ttft_s = ttft_s if table.ttft_s is None else table.ttft_s + TTFT_WEIGHT * (ttft_s - table.ttft_s)
        new_block = prompt_tokens // self.block_tokens > cached_tokens // self.block_tokens
        if new_block and table.expecting_since is not None and table.due_since is None:
            table.due_since = self.clock()

    def match(self, hashes: Sequence[int], replica_id: str) -> tuple[int, str]:
        """Leading blocks of `hashes` the replica holds, and whether any was only speculated."""
        table = self._tables.get(replica_id)
        if table is None:
            return 0, EVENTS
        now = self.clock()
        held, speculative = table.held, table.speculative
        evidence = EVENTS
        n = 0
        for key in hashes:
            if key not in held:
                if speculative.get(key, 0.0) <= now:
                    break
                evidence = SPECULATIVE
            n += 1
        return n, evidence

    def speculate(self, replica_id: str, hashes: Sequence[int]) -> None:
        """The request was sent there: its blocks count as held until the events catch up."""
        table = self._tables.get(replica_id)
        if table is None or not hashes:
            return
        now = self.clock()
        window = self._window(table)
        expiry = now + window
        speculative = table.speculative
        for key in hashes:
            if key not in table.held:
                speculative[key] = expiry
                if table.expecting_since is None:
                    table.expecting_since = now
        if now >= table.next_sweep:  # drop expired entries once per window: bounded by recent traffic
            table.next_sweep = now + window
            table.speculative = {k: t for k, t in speculative.items() if t > now}

    def unspeculate(self, replica_id: str, hashes: Sequence[int]) -> None:
        """The request never reached the replica: its speculation is withdrawn."""
        table = self._tables.get(replica_id)
        if table is not None:
            for key in hashes:
                table.speculative.pop(key, None)

    def forget(self, replica_id: str) -> None:
        """The replica left the pool (its subscriber is closed)."""
        self._tables.pop(replica_id, None)

    def describe(self, replica_id: str) -> dict[str, object]:
        table = self._tables.get(replica_id)
        if table is None:
            return {}
        return {
            "certain": self.certain(replica_id),
            "silent": table.silent,
            "blocks": len(table.own_key),
            "speculative": len(table.speculative),
            "orphan_blocks": table.orphans,
            "capacity_blocks": self.capacity(replica_id),
            "over_capacity": table.overflowed,
            "events_window_s": round(self._window(table), 3),
        }

    def size(self, replica_id: str) -> int:
        table = self._tables.get(replica_id)
        return len(table.own_key) if table else 0

    def _window(self, table: _Table) -> float:
        """How long a dispatched request's events may take: a multiple of the replica's prefill time."""
        return max(self.speculative_ttl_s, PREFILL_MULTIPLE * (table.ttft_s or 0.0))

    def _heard(self, replica_id: str) -> _Table:
        """An event arrived: the publisher reaches us."""
        table = self._table(replica_id)
        table.expecting_since = table.due_since = None
        table.silent = False
        return table

    def _table(self, replica_id: str) -> _Table:
        table = self._tables.get(replica_id)
        if table is None:
            table = self._tables[replica_id] = _Table()
        return table
