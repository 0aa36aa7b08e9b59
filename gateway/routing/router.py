"""Router: turns a request and the pool's candidates into a Decision, for one pool.

The request path calls `decide()` per attempt (again if admission lost the slot), `dispatched()`
once the slot is held, `failed()` for an attempt that got no answer, and `finished()` once per
request. Nothing is recorded for a replica before it holds the request, and a failed attempt
takes back what it recorded.
For policies that need the prefix, the Router keys the prompt once (kept on the view for
retries): token-exact when the pool names its tokenizer (`gateway.prompt.tokenizers`, off the event
loop, within a budget), else in character blocks. Each candidate's warm prefix then comes
from the best evidence there is for it, the exactness ladder:

- `events`: the replica publishes KV events and its exact table (`index.exact`) is certain;
- `speculative`: ...plus blocks of requests just sent there, before their events arrive;
- `history`: token keys looked up in the warm index of requests routed there (memory or Redis,
  one round trip for every candidate that needs it), also the fallback of an uncertain table;
- `characters`: the same history, keyed by character blocks (no tokenizer, or over budget).

On dispatch it records the request's blocks for the chosen replica (history, and a
speculative entry where events run), and on finish the answer too (the next turn starts with
it). It keeps the chosen replica's prediction per request until `finished()`, to learn from
the observed TTFT and to export how right the prediction was, per rung.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from gateway.config.features import IndexConfig
from gateway.config.pools import PrefixConfig
from gateway.index import MemoryIndex, WarmIndex
from gateway.index.exact import ExactTables
from gateway.index.in_flight import InFlightBlocks
from gateway.observability.routing_metrics import RoutingMetrics
from gateway.prompt import prefix_keys as prefix
from gateway.prompt.prefix_keys import CHARACTERS, TOKENS
from gateway.prompt.prompt_keys import PromptKeys
from gateway.request.decision import Candidate, Decision, Outcome, Score
from gateway.routing.calibration import Calibration
from gateway.routing.policies import Policy
from gateway.support.bounded import put_newest
from gateway.support.soon import Soon
from gateway.view import RequestView

MAX_TRACKED = 100_000  # predictions kept for requests not yet finished (bounds a leak if one never is)
HISTORY = "history"  # the warm index of routed requests; CHARACTERS (prefix) when keyed by characters


class Router:
    def __init__(
        self,
        policy: Policy,
        prefix_params: PrefixConfig | None = None,
        index: WarmIndex | None = None,
        metrics: RoutingMetrics | None = None,
        pool: str = "default",
        keys: PromptKeys | None = None,
        exact: ExactTables | None = None,
    ) -> None:
        """`index` and `keys` are owned (closed by `close()`); a fresh in-memory index when not given.
        `keys`: token-exact prompts; `exact`: tables fed by the replicas' KV events (needs `keys`)."""
        self.policy = policy
        self.index: WarmIndex = index if index is not None else MemoryIndex(IndexConfig().capacity_blocks)
        self.metrics = metrics
        self.pool = pool
        self.keys = keys
        self.exact = exact
        self._predicted: dict[str, tuple[Score, str]] = {}  # request id -> chosen row and its evidence
        self.in_flight = InFlightBlocks()  # chains of the requests each replica serves now: held there
        self.calibration = Calibration(prefix_params or PrefixConfig(), self.index, exact, metrics, pool)
        if exact is not None:
            exact.on_block_size = self.calibration.block_size_seen
        self._background: set[asyncio.Task[None]] = set()
        self._pool_series: tuple[Any, Any] | None = None  # route_seconds, matched_tokens: `_observe`
        self._degraded_shown: bool | None = None  # index_degraded as last set

    @property
    def prefix_params(self) -> PrefixConfig:
        """How prompts are keyed, its block size learned from the replicas when the config leaves it unset."""
        return self.calibration.prefix_params

    async def decide(self, view: RequestView, candidates: Sequence[Candidate]) -> Decision:
        """Pick a replica; commits nothing (admission may still lose the slot and decide again)."""
        start = time.perf_counter()
        evidence = await self._fill(view, candidates)
        decision = self.policy.choose(view, candidates)
        chosen = decision.chosen()
        rung = evidence.get(decision.replica_id, "")
        if rung:
            decision = decision.with_evidence(rung)
        if self.metrics is not None:
            _DECIDED.add((self, decision, chosen, rung, time.perf_counter() - start))
        return decision

    def dispatched(self, view: RequestView, decision: Decision) -> None:
        """Commit a decision: the request holds its slot on the chosen replica and is sent next. Count its
        queued prefill there and its blocks as warm there (so a burst of siblings follows it), and keep
        the prediction to check against the answer. Only a committed decision leaves a trace."""
        replica_id = decision.replica_id
        chosen = decision.chosen()
        if chosen is not None:
            self._track(view.request_id, chosen, decision.evidence)
        self.policy.on_dispatched(view, decision)
        if self.policy.needs_index and view.block_hashes:
            added = self.index.record(replica_id, view.block_hashes)
            view.recorded = (replica_id, added)
            self.in_flight.add(view.request_id, replica_id, view.block_hashes)
            exact = self._exact_for(view)
            if exact is not None:
                exact.speculate(replica_id, view.block_hashes)

    async def route(self, view: RequestView, candidates: Sequence[Candidate]) -> Decision:
        """decide and dispatched in one call, for callers that always send (the simulator, benches)."""
        decision = await self.decide(view, candidates)
        self.dispatched(view, decision)
        return decision

    def failed(self, view: RequestView, replica_id: str) -> None:
        """An attempt on `replica_id` failed before any answer byte (connect error, 5xx, timeout):
        take back what `dispatched` committed there, so no phantom warm prefix or queued prefill
        stays on a replica that never ran the request. Then the request may decide again."""
        self.policy.on_failed(view, replica_id)
        self.in_flight.remove(view.request_id)
        recorded, view.recorded = view.recorded, None
        if recorded is not None and recorded[0] == replica_id and recorded[1]:
            self.index.unrecord(replica_id, view.block_hashes[-recorded[1] :])
        exact = self._exact_for(view)
        if exact is not None:
            exact.unspeculate(replica_id, view.block_hashes)
        tracked = self._predicted.get(view.request_id)
        if tracked is not None and tracked[0].replica_id == replica_id:
            del self._predicted[view.request_id]

    async def removed(self, replica_id: str) -> None:
        """The replica left the pool: its warm prefixes go, and what the policy learned of it."""
        await self.index.forget(replica_id)
        self.policy.on_removed(replica_id)

    def prefill_s_per_token(self, replica_id: str) -> float | None:
        """The prefill cost per token the policy has learned for the replica, if it models one."""
        return self.policy.prefill_s_per_token(replica_id)

    def first_token(self, view: RequestView, replica_id: str) -> None:
        """The answer's first byte came from `replica_id`: its prefill is done (the cost model's
        queue of prefill work there moves up at once)."""
        self.policy.on_first_token(view, replica_id)

    def finished(self, view: RequestView, replica_id: str, outcome: Outcome) -> Score | None:
        """The request ended on `replica_id`, its last attempt (earlier failed attempts were each
        reported to `failed`). Called once per request that reached a replica. `outcome` carries
        the observed TTFT and the replica's usage counts. Returns what was predicted for it."""
        self.in_flight.remove(view.request_id)
        tracked = self._predicted.get(view.request_id)
        predicted: Score | None = None
        if tracked is not None and tracked[0].replica_id == replica_id:
            del self._predicted[view.request_id]
            predicted, rung = tracked
        # else: an earlier attempt that failed; the latest attempt is reported separately
        if predicted is not None and outcome.ok and self.metrics is not None:
            if outcome.cached_tokens is not None:
                self.metrics.cached_error.labels(self.pool, rung).observe(
                    predicted.cached_tokens - outcome.cached_tokens
                )
            if outcome.ttft_s is not None and self.policy.needs_index:
                self.metrics.ttft_error.labels(self.pool).observe(predicted.score - outcome.ttft_s)
        exact = self.exact  # whatever its keys: the replica stored its blocks either way
        if exact is not None and outcome.ok and outcome.prompt_tokens is not None:
            exact.completed(replica_id, outcome.prompt_tokens, outcome.cached_tokens or 0, outcome.ttft_s)
        if outcome.ok and outcome.prompt_tokens and view.key_kind == CHARACTERS:
            self.calibration.learn_ratio(view, outcome.prompt_tokens)
        self.record_answer(view, replica_id, outcome)
        self.policy.on_finished(view, replica_id, outcome.with_predicted(predicted))
        return predicted

    @property
    def records_answers(self) -> bool:
        """Whether `record_answer` wants the answer's text (the request path collects it only then)."""
        return self.policy.needs_index

    def record_answer(self, view: RequestView, replica_id: str, outcome: Outcome) -> None:
        """The replica keeps the answer's KV too; the conversation's next turn starts with it. `finished` calls
        this for an outcome that carries the answer; the gateway's request path calls it apart, after the
        answer went out, in the batch of what only records (`gateway.routing.feedback`)."""
        if outcome.ok and outcome.answer and self.records_answers:
            self._record_answer(view, replica_id, outcome)

    async def explain(self, view: RequestView, candidates: Sequence[Candidate]) -> dict[str, Any]:
        """Dry run: what `route` would decide now, recording nothing (a rotating policy still rotates)."""
        evidence = await self._fill(view, candidates)
        decision = self.policy.choose(view, candidates)
        return {
            "policy": self.policy.type,
            "prompt_tokens_estimate": view.prompt_tokens_estimate,
            "prefix_blocks": len(view.block_hashes),
            "prefix_keys": view.key_kind or None,
            "preamble_tokens": view.preamble_tokens,
            "index_degraded": self.index.degraded,
            "evidence": evidence,
            **decision.explain(),
        }

    async def close(self) -> None:
        _DECIDED.flush()
        self._predicted.clear()
        for task in list(self._background):
            task.cancel()
        if self.keys is not None:
            await self.keys.close()
        await self.index.close()

    async def _fill(self, view: RequestView, candidates: Sequence[Candidate]) -> dict[str, str]:
        """Key the prompt once per request, then fill each candidate's warm-prefix length from the
        best evidence for it. Returns each candidate's rung."""
        if not self.policy.needs_prefix:
            return {}
        if not view.block_hashes:
            prefix.attach(view, await self._key(view))
            ratio = self.calibration.token_ratio
            if view.key_kind == CHARACTERS and ratio != 1.0:  # in the replica's tokens
                view.tokens_per_block *= ratio
                view.prompt_tokens_estimate = round(view.prompt_tokens_estimate * ratio)
        if not self.policy.needs_index or not view.block_hashes:
            return {}
        for c in candidates:
            c.cache_fill = self.index.fill(c.replica_id)
        evidence: dict[str, str] = {}
        rest: list[Candidate] = []  # candidates the history index must answer for
        exact = self._exact_for(view)
        if exact is not None:
            for c in candidates:
                if exact.covers(c.replica_id):
                    blocks, evidence[c.replica_id] = exact.match(view.block_hashes, c.replica_id)
                    c.cached_tokens = self._tokens(view, blocks)
                    if exact.certain(c.replica_id):
                        continue
                rest.append(c)
        else:
            rest = list(candidates)
        if not rest:
            return evidence
        if self.index.degraded and self.metrics is not None:
            self.metrics.index_fallbacks.labels(self.pool).inc()
        matched = await self.index.match(view.block_hashes, [c.replica_id for c in rest])
        estimate = HISTORY if view.key_kind == TOKENS else CHARACTERS
        in_flight = self.in_flight
        for c in rest:
            blocks = matched.get(c.replica_id, 0)
            running = in_flight.match(view.block_hashes, c.replica_id)
            tokens = self._tokens(view, running if running > blocks else blocks)
            if c.replica_id not in evidence or tokens > c.cached_tokens:  # an uncertain table: the larger
                c.cached_tokens, evidence[c.replica_id] = tokens, estimate
        return evidence

    async def _key(self, view: RequestView) -> prefix.Prefix:
        """Token-exact keys when a tokenizer is configured and answers within budget, else characters."""
        if self.keys is not None and view.endpoint in ("chat", "completions"):
            tokenized = await self.keys.encode(view.endpoint, view.body)
            if tokenized is not None:
                return prefix.from_tokens(view, self.prefix_params, tokenized)
            if self.metrics is not None:
                self.metrics.tokenize_fallbacks.labels(self.pool).inc()
        return prefix.compute(view, self.prefix_params)

    def _exact_for(self, view: RequestView) -> ExactTables | None:
        """The event tables, if `view` can match them: event-derived keys are unsalted token keys, and
        an adapter's only where the events name their adapters."""
        if view.key_kind != TOKENS or prefix.is_salted(view, self.prefix_params):
            return None
        if view.adapter is not None and self.exact is not None and not self.exact.names_adapters:
            return None
        return self.exact

    @staticmethod
    def _tokens(view: RequestView, blocks: int) -> int:
        """Cached prompt tokens for `blocks` warm blocks. With token keys this is exact: the engine
        always computes the last prompt token, so a prompt ending on a block boundary never hits
        its last block (vLLM caps hits at prompt_tokens - 1)."""
        if view.key_kind == TOKENS:
            per_block = int(view.tokens_per_block)
            return min(blocks, (view.prompt_tokens_estimate - 1) // per_block) * per_block
        return min(int(blocks * view.tokens_per_block), view.prompt_tokens_estimate)

    def _record_answer(self, view: RequestView, replica_id: str, outcome: Outcome) -> None:
        """A certain event table learns of the answer's blocks from the replica itself; history needs them
        recorded."""
        exact = self._exact_for(view)
        if exact is not None and exact.certain(replica_id):
            return
        assert outcome.answer is not None
        if view.key_kind != TOKENS:
            self.index.record(replica_id, prefix.with_answer(view, self.prefix_params, outcome.answer))
            return
        if self.keys is None:
            return  # token ids from the client: the answer's ids are not known here
        task = asyncio.get_running_loop().create_task(self._record_answer_tokens(view, replica_id, outcome))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _record_answer_tokens(self, view: RequestView, replica_id: str, outcome: Outcome) -> None:
        """Tokenize the conversation with its answer off the request path (this also warms the
        tokenizer's cache for the next turn) and record its chain, as far as the replica holds
        it: the prompt and every generated token but the last (which is never computed)."""
        assert self.keys is not None and outcome.answer is not None
        body = prefix.body_with_answer(view, outcome.answer)
        tokenized = await self.keys.encode_later(view.endpoint, body) if body is not None else None
        if tokenized is None:
            return
        chain = prefix.from_tokens(view, self.prefix_params, tokenized).block_hashes
        if outcome.prompt_tokens is not None and outcome.completion_tokens is not None:
            held = outcome.prompt_tokens + outcome.completion_tokens - 1
            chain = chain[: held // self.prefix_params.block]
        self.index.record(replica_id, chain)

    def _track(self, request_id: str, chosen: Score, rung: str) -> None:
        put_newest(self._predicted, request_id, (chosen, rung), MAX_TRACKED)  # a retry's replaces the earlier

    def _observe(self, decision: Decision, chosen: Score | None, rung: str, elapsed_s: float) -> None:
        """The decision's series; the pool's own children are looked up at its first decision, and the
        degraded gauge is set when it changes, not on every request."""
        assert self.metrics is not None
        m, pool = self.metrics, self.pool
        if self._pool_series is None:
            self._pool_series = (m.route_seconds.labels(pool), m.matched_tokens.labels(pool))
        route_seconds, matched_tokens = self._pool_series
        m.decisions.labels(pool, self.policy.type, decision.reason).inc()
        route_seconds.observe(elapsed_s)
        if self.policy.needs_index:
            matched_tokens.observe(chosen.cached_tokens if chosen else 0)
            if rung:
                m.evidence.labels(pool, rung).inc()
            degraded = self.index.degraded
            if degraded != self._degraded_shown:
                m.index_degraded.labels(pool).set(1 if degraded else 0)
                self._degraded_shown = degraded


def _observe_decisions(decided: list[tuple[Router, Decision, Score | None, str, float]]) -> None:
    for router, decision, chosen, rung, elapsed_s in decided:
        router._observe(decision, chosen, rung, elapsed_s)


# Every router's decisions' metrics, recorded together once per loop turn (gateway.support.soon: why). One
# batch for the process, not one per router: a router holding its own would hold itself (through the
# batch's bound handler) and outlive a reload until a full collection.
_DECIDED: Soon[tuple[Router, Decision, Score | None, str, float]] = Soon(_observe_decisions)
