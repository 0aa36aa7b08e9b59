"""A prompt-prefix hygiene report: which families of prompts share most of their text but diverge early
(a timestamp, a session id or a user name near the top), so that the replicas' prefix cache never hits.

A KV entry depends on every token before it, so the routing chain of prefix hashes (`view.block_hashes`)
tells where two prompts diverge, but not whether they match again after that. For that each analysed
prompt also gets position-independent hashes: the text is cut into pieces at content-defined points
(line, sentence and clause ends: `\n . ! ? : ; ,`), each piece hashed on its own (xxh3), so a piece
hashes the same wherever it sits. Two prompts of one family diverge at chain block d and at the first
piece that differs (its character offset gives the token offset); the pieces after that point the earlier
prompt also has after it are the shared text the cache could have served, had the volatile part been at
the bottom.

A family is a tenant (its key; "anonymous" without auth) and pool, and within it the text that matches
after the divergence (named by the hash of its first shared piece: one system prompt). A new prompt is
compared with its tenant's latest and with the kept ones that share one of its anchors (the smallest
hashes of its longer pieces), so a tenant's interleaved system prompts each meet their own siblings. A finding needs
at least `prefix_report.min_tokens` shared tokens after the divergence. Lost prefill seconds are those
tokens at the pool's learned prefill cost per token (prefix_affinity's cost model; the default 0.0002
without one); lost money is them at the input price less the cached-input price (`pools.<m>.prices`).

No prompt text is stored: per (tenant, pool) the hashes of `prefix_report.samples` prompts, one per
content family (16 bytes per piece, at most `_MAX_PIECES` pieces each: 16 kB), for at most
`prefix_report.families` of them (at the defaults at most 16 MB, typically far less). With
`logging.prompts: true` only, a finding keeps a few characters around its latest divergence. The request
path only appends the finished request to a bounded queue (`prefix_report.queue`; more, and bodies over
1 MiB, are skipped and counted); a background task renders and hashes each prompt in a thread, then
compares it on the event loop (bounded work: at most `_MAX_PIECES` pieces and a few siblings).
"""

from __future__ import annotations

import asyncio
import heapq
import re
from array import array
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
import xxhash
from aiohttp import web

from gateway.config.features import PrefixReportConfig
from gateway.config.policy_params import CostModelConfig
from gateway.config.pools import PricesConfig
from gateway.insights.token_costs import ANONYMOUS
from gateway.prompt.prefix_keys import prompt_source
from gateway.request.exchange import FinishedRequest
from gateway.request.observers import RequestObserver
from gateway.support.background import background

if TYPE_CHECKING:
    from gateway.view import RequestView

log = structlog.get_logger("gateway.insights.prefix_report")
_PIECE = re.compile(r"[^\n.!?:;,]+[\n.!?:;,]*|[\n.!?:;,]+")  # up to and with a line, sentence or clause end
_MAX_PIECES = 1024
_MAX_BODY_BYTES = 1 << 20  # a larger request is not analysed (skipped): the queue holds bodies until then
_ANCHORS = 4
_ANCHOR_CHARS = 24  # pieces this long or longer may be anchors (short ones repeat across unrelated prompts)
_AROUND_CHARS = 24  # before the divergence (and twice that of the piece from it), with logging.prompts only
_DEFAULT_RATE = CostModelConfig().prefill_s_per_token


@dataclass(frozen=True, slots=True)
class _Offered:
    """A finished request as the request path hands it over: references only, nothing computed."""

    tenant: str
    model: str
    endpoint: str
    body: dict[str, Any]
    chain: tuple[int, ...]
    tokens_per_block: float
    chars_per_token: float
    prefill_s_per_token: float
    prices: PricesConfig | None


@dataclass(slots=True)
class _Signature:
    chain: tuple[int, ...]
    hashes: array[int]
    starts: array[int]
    lengths: array[int]
    anchors: tuple[int, ...]  # the smallest hashes of its longer pieces: found by content, wherever they sit
    serial: int = 0


class _Samples:
    """One tenant and pool's kept prompts, one per content family: a new prompt is compared with the
    latest and with those sharing an anchor (so families that interleave still meet their siblings),
    then takes the place of the one it matched (or of the least recently matched one)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._kept: OrderedDict[int, _Signature] = OrderedDict()  # by serial, least recently matched first
        self._by_anchor: dict[int, int] = {}
        self._serial = 0

    def siblings(self, new: _Signature) -> list[_Signature]:
        serials = {self._by_anchor[a] for a in new.anchors if a in self._by_anchor}
        if self._kept:
            serials.add(next(reversed(self._kept)))
        return [self._kept[s] for s in serials]

    def keep(self, new: _Signature, replacing: _Signature | None) -> None:
        if replacing is not None:
            self._drop(replacing.serial)
        self._serial += 1
        new.serial = self._serial
        self._kept[new.serial] = new
        self._by_anchor.update((a, new.serial) for a in new.anchors)
        while len(self._kept) > self.size:
            self._drop(next(iter(self._kept)))

    def _drop(self, serial: int) -> None:
        old = self._kept.pop(serial)
        for a in old.anchors:
            if self._by_anchor.get(a) == serial:
                del self._by_anchor[a]


@dataclass(slots=True)
class _Finding:
    tenant: str
    model: str
    family: str
    requests: int = 0
    blocks: Counter[int] = field(default_factory=Counter)
    token_offset: int = 0
    recoverable_tokens: int = 0  # the latest request's
    lost_tokens: int = 0
    lost_prefill_s: float = 0.0
    lost_cost: float | None = None
    around: str | None = None

    def to_json(self, seen: int) -> dict[str, Any]:
        block = self.blocks.most_common(1)[0][0]
        return {
            "tenant": self.tenant,
            "model": self.model,
            "family": self.family,
            "requests_seen": seen,
            "affected_requests": self.requests,
            "divergence": {"block": block, "token_offset": self.token_offset},
            "recoverable_tokens": self.recoverable_tokens,
            "lost": {
                "tokens": self.lost_tokens,
                "prefill_s": round(self.lost_prefill_s, 6),
                "cost": None if self.lost_cost is None else round(self.lost_cost, 9),
            },
            **({"around": self.around} if self.around is not None else {}),
        }


class PrefixReport(RequestObserver):
    """Offered every answered request's prefix chain; hashes and compares them off the request path."""

    def __init__(self, config: PrefixReportConfig, show_text: Callable[[], bool] = lambda: False) -> None:
        self.config = config
        self.show_text = show_text  # logging.prompts now: keep a few characters around a divergence
        self._queue: deque[_Offered] = deque()
        self._ready = asyncio.Event()
        self._samples: OrderedDict[tuple[str, str], _Samples] = OrderedDict()
        self._seen: dict[tuple[str, str], int] = {}
        self._findings: OrderedDict[tuple[str, str, str], _Finding] = OrderedDict()
        self.analysed = self.skipped = 0

    @classmethod
    def attach(cls, app: web.Application, config: PrefixReportConfig, show_text: Callable[[], bool]) -> PrefixReport:
        report = cls(config, show_text)
        app.cleanup_ctx.append(background("prefix-report", report._loop))
        return report

    def finished(self, done: FinishedRequest) -> None:
        if done.replica_id is not None and done.status == 200:
            pool = done.pool
            self.offer(
                done.caller.tenant,
                done.model,
                done.view,
                done.routing.prefix.chars_per_token,
                done.router.prefill_s_per_token(done.replica_id),
                pool.prices if pool is not None else None,
            )

    def offer(
        self,
        tenant: str | None,
        model: str,
        view: RequestView,
        chars_per_token: float,
        prefill_s_per_token: float | None,
        prices: PricesConfig | None,
    ) -> None:
        """A finished request with a prefix chain (from `gateway.serving.app._finished`): O(1), no hashing here."""
        if not self.config.enabled or not view.block_hashes:
            return
        if len(self._queue) >= self.config.queue or len(view.raw) > _MAX_BODY_BYTES:
            self.skipped += 1
            return
        self._queue.append(
            _Offered(
                tenant or ANONYMOUS,
                model,
                view.endpoint,
                view.body,
                view.block_hashes,
                view.tokens_per_block,
                chars_per_token,
                prefill_s_per_token or _DEFAULT_RATE,
                prices,
            )
        )
        self._ready.set()

    def report(self) -> dict[str, Any]:
        rows = [f.to_json(self._seen.get((f.tenant, f.model), 0)) for f in self._findings.values()]
        rows.sort(key=lambda row: -row["lost"]["tokens"])
        return {
            "families": rows,
            "analysed_requests": self.analysed,
            "skipped_requests": self.skipped,
            "pending_requests": len(self._queue),
            "min_tokens": self.config.min_tokens,
        }

    def compare(self, item: _Offered, text: str, signature: _Signature) -> None:
        """Compare a prepared prompt with its tenant's kept ones, keep it, count a finding: bounded work
        (at most `_MAX_PIECES` pieces, a few siblings), on the event loop with the tables it changes."""
        self.analysed += 1
        key = (item.tenant, item.model)
        self._seen[key] = self._seen.get(key, 0) + 1
        samples = self._samples.get(key)
        if samples is None:
            samples = self._samples[key] = _Samples(self.config.samples)
            _bound(self._samples, self.config.families)
            _bound(self._seen, self.config.families * 2)
        self._samples.move_to_end(key)
        best: tuple[int, int, int, int, bool] | None = None
        matched: _Signature | None = None
        for old in samples.siblings(signature):
            found = _compare(signature, old)
            if best is None or found[2] > best[2]:
                best, matched = found, old
        related = (
            best is not None
            and matched is not None
            and (best[2] > 0 or best[4] or not set(signature.anchors).isdisjoint(matched.anchors))
        )
        samples.keep(signature, matched if related else None)  # the newest of a family stands for it
        if best is None:
            return
        block, piece, shared_chars, first_shared, _ = best
        tokens = int(shared_chars / item.chars_per_token)
        if tokens < self.config.min_tokens:
            return
        family = f"{first_shared:016x}"
        finding = self._findings.get((*key, family))
        if finding is None:
            finding = self._findings[(*key, family)] = _Finding(item.tenant, item.model, family)
            _bound(self._findings, self.config.families)
        self._findings.move_to_end((*key, family))
        offset = signature.starts[piece]
        finding.requests += 1
        finding.blocks[block] += 1
        finding.token_offset = int(offset / item.chars_per_token)
        finding.recoverable_tokens = tokens
        finding.lost_tokens += tokens
        finding.lost_prefill_s += tokens * item.prefill_s_per_token
        if item.prices is not None:
            lost = tokens * (item.prices.input - item.prices.cached_input) / 1e6
            finding.lost_cost = (finding.lost_cost or 0.0) + lost
        if self.show_text():
            end = offset + min(signature.lengths[piece], 2 * _AROUND_CHARS)  # the piece that differs, or its start
            finding.around = _readable(text[max(offset - _AROUND_CHARS, 0) : end])

    async def _loop(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._queue:
                item = self._queue.popleft()
                try:  # rendering and hashing a long prompt in a thread: the loop keeps serving meanwhile
                    prepared = await asyncio.to_thread(prepare, item)
                    if prepared is not None:
                        self.compare(item, *prepared)
                except Exception:  # one odd prompt must not stop the report
                    log.exception("prefix_report_failed")


def prepare(item: _Offered) -> tuple[str, _Signature] | None:
    """The prompt's text and hashes (None for a prompt of token ids): a pure function, run in a thread."""
    text, _ = prompt_source(item.endpoint, item.body)
    return (text, _signature(text, item.chain)) if isinstance(text, str) else None


def _signature(text: str, chain: tuple[int, ...]) -> _Signature:
    hashes, starts, lengths = array("Q"), array("I"), array("I")
    for match in _PIECE.finditer(text):
        if len(hashes) >= _MAX_PIECES:
            break
        piece = match.group()
        hashes.append(xxhash.xxh3_64_intdigest(piece.encode()))
        starts.append(match.start())
        lengths.append(len(piece))
    longer = {h for h, n in zip(hashes, lengths) if n >= _ANCHOR_CHARS}
    return _Signature(chain, hashes, starts, lengths, tuple(heapq.nsmallest(_ANCHORS, longer)))


def _compare(new: _Signature, old: _Signature) -> tuple[int, int, int, int, bool]:
    """(divergence block, first differing piece of `new`, characters of `new` after it that `old` also has
    after its divergence, the first such piece's hash, whether one prompt extends the other: then nothing
    is shared after a divergence)."""
    block = _common(new.chain, old.chain)
    piece = _common(new.hashes, old.hashes)
    if block >= min(len(new.chain), len(old.chain)) or piece >= min(len(new.hashes), len(old.hashes)):
        return block, piece, 0, 0, True
    later = set(old.hashes[piece:])
    shared, first = 0, 0
    for i in range(piece, len(new.hashes)):
        if new.hashes[i] in later:
            shared += new.lengths[i]
            first = first or new.hashes[i]
    return block, piece, shared, first, False


def _common(a: Any, b: Any) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _bound(table: OrderedDict[Any, Any] | dict[Any, Any], size: int) -> None:
    while len(table) > size:
        del table[next(iter(table))]


def _readable(text: str) -> str:
    """The chat rendering's role and field markers as `|`."""
    return text.replace("\x1e", "|").replace("\x1f", "|")
