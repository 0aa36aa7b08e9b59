"""`affinity-gateway simulate`: a discrete-event simulation of a gateway in front of N sim replicas.

Virtual time, no sockets, one process. Each replica is the replica stub's own machinery — its
`Scheduler`, `KVCacheManager` over a `BlockPool` (prefix cache with LRU eviction) and the sim
engine's `step_ms` cost model — stepped on an event heap instead of `asyncio.sleep`. The gateway
side is the real `Router` with the real policy and in-memory warm index, fed the same Candidate
fields the server builds: exact in-flight counts and a periodic "scrape" of running / waiting /
KV usage. Prompts are tokenized by the stub's tokenizer and chat template, answers are words
of the stub's vocabulary, so the cache sees exactly what a real sim replica would see.

With `kv_events`, each replica's block pool feeds the gateway's exact tables directly (the KV-event
rung with zero delivery delay) and requests are keyed by the same stub tokens; without it, the
gateway routes from its own history in character blocks, as a gateway without a tokenizer does.

What it leaves out: network and event-loop time (the real stub adds a little per step), health
probes and failures, and the engine's random answer lengths (like `bench`, every answer is
exactly `max_tokens` long: `ignore_eos`).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

import xxhash

from gateway.index.exact import ExactTables
from gateway.prompt import prefix_keys as prefix
from gateway.prompt.sim_tokens import IM_END, IM_START
from gateway.prompt.tokenized import TokenizedPrompt
from gateway.request.decision import Candidate, Outcome
from gateway.routing.router import Router
from gateway.view import RequestView
from lab import workloads
from lab.oracle import OraclePolicy
from lab.results import Result
from lab.sim_spec import SimSpec, build_policy_for, run_sync
from lab.sim_state import Active, DecodeRun, SimReplica
from lab.workloads import Session
from replica_stub.block_pool import BlockPool, BlockRemoved, BlockStored, KVEvent
from replica_stub.engine.simulated import SimEngine
from replica_stub.kv_cache import KVCacheManager
from replica_stub.request import Request, SamplingParams
from replica_stub.scheduler import Scheduler, SchedulerOutput

OnResult = Callable[[Result], None]


class Simulation:
    fast_forward = True  # run plain decode steps without the scheduler's per-step bookkeeping (same results)

    def __init__(self, spec: SimSpec, on_result: OnResult | None = None) -> None:
        self.spec = spec
        self.now = 0.0
        self.on_result = on_result
        self.results: list[Result] = []
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        stub = spec.stub
        self.engine = SimEngine(stub.timing, speedup=stub.speedup)
        self.tokenizer = self.engine.tokenizer
        self._encoded: dict[str, list[int]] = {}
        self.prefix = spec.prefix.model_copy(update={"block_tokens": stub.block_size})
        self.exact = (
            ExactTables(prefix.model_seed(spec.model), stub.block_size, self.prefix.speculative_ttl_s, clock=self.clock)
            if spec.kv_events
            else None
        )
        self.replicas = {
            name: SimReplica(
                name,
                Scheduler(
                    KVCacheManager(BlockPool(stub.num_gpu_blocks, stub.block_size, self._event_sink(name))),
                    max_num_seqs=stub.max_num_seqs,
                    max_num_batched_tokens=stub.max_num_batched_tokens,
                    max_model_len=stub.max_model_len,
                ),
            )
            for name in (f"replica-{i}" for i in range(spec.replicas))
        }
        self.router = Router(build_policy_for(spec, self.clock), self.prefix, pool=spec.model, exact=self.exact)
        self.routing_prompt: list[int] = []  # the prompt being routed, in stub tokens
        if isinstance(self.router.policy, OraclePolicy):
            self.router.policy.bind(self)  # it reads the replicas' true state
        for name in self.replicas:
            self.router.calibration.set_capacity(name, stub.num_gpu_blocks * stub.block_size)
        self._active: dict[str, Active] = {}
        self._by_request: dict[str, Active] = {}
        self._vocab_ids = [self.tokenizer.encode(w)[0] for w in self.engine.vocab]
        self._word = dict(zip(self._vocab_ids, self.engine.vocab))
        self._generation_prompt = self.tokenizer.encode(f"{IM_START}assistant\n")
        self._end_of_message = self.tokenizer.encode(f"{IM_END}\n")
        self._queue: list[Session] = []
        self._ids = 0

    def clock(self) -> float:
        return self.now

    def _event_sink(self, name: str) -> Callable[[KVEvent], None] | None:
        """The replica's KV events, delivered to the gateway's exact table at once."""
        exact = self.exact
        if exact is None:
            return None
        exact.set_certain(name, True)

        def deliver(event: KVEvent) -> None:
            if isinstance(event, BlockStored):
                exact.stored(name, event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size)
            elif isinstance(event, BlockRemoved):
                exact.removed(name, event.block_hashes)
            else:  # AllBlocksCleared
                exact.cleared(name)

        return deliver

    def run(self, sessions: list[Session]) -> list[Result]:
        """Simulate until every session has finished; returns one Result per request."""
        if self.spec.concurrency > 0:
            self._queue = list(reversed(sessions))
            for _ in range(min(self.spec.concurrency, len(sessions))):
                self._at(0.0, self._next_closed_loop)
        else:
            for session in sessions:
                self._at(session.start_s, lambda s=session: self._start(s))  # type: ignore[misc]
        self._at(0.0, self._scrape)
        while self._heap:
            self.now, _, action = heapq.heappop(self._heap)
            action()
        run_sync(self.router.close())
        return self.results

    def _at(self, when: float, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, action))

    def _scrape(self) -> None:
        for r in self.replicas.values():
            scheduler = r.scheduler
            r.running, r.waiting = len(scheduler.running), len(scheduler.waiting)
            r.kv_usage = scheduler.kv.pool.usage()
        if self._heap:  # anything left to happen
            self._at(self.now + self.spec.scrape_interval_s, self._scrape)

    def _next_closed_loop(self) -> None:
        if self._queue:
            self._start(self._queue.pop())

    def _start(self, session: Session) -> None:
        seed = xxhash.xxh3_64_intdigest(f"{self.spec.seed}:{session.session_id}".encode())
        messages = [{"role": "system", "content": session.system}] if session.system else []
        tokens = [t for m in messages for t in self._encode_message(m, cache=True)]
        active = Active(session, 0, messages, tokens, random.Random(seed))
        self._active[session.session_id] = active
        self._send(active)

    def _encode_message(self, message: dict[str, str], cache: bool = False) -> list[int]:
        """The stub's ChatML rendering of one message, tokenized. Every message starts with a
        special token, so encoding message by message equals encoding the whole template."""
        text = f"{IM_START}{message['role']}\n{message['content']}{IM_END}\n"
        if not cache:
            return self.tokenizer.encode(text)
        ids = self._encoded.get(text)
        if ids is None:
            ids = self._encoded[text] = self.tokenizer.encode(text)
        return ids

    def _send(self, active: Active) -> None:
        session, spec = active.session, self.spec
        message = {"role": "user", "content": session.user_turns[active.turn]}
        active.messages.append(message)
        active.token_ids += self._encode_message(message)
        prompt_ids = active.token_ids + self._generation_prompt
        self._ids += 1
        request_id = f"sim-{self._ids}"
        stub = spec.stub
        if len(prompt_ids) + session.max_tokens > stub.max_model_len:  # the stub answers 400, as vLLM does
            self._record(
                Result(
                    session.session_id,
                    active.turn,
                    ok=False,
                    status=400,
                    scheduled_s=self.now,
                    sent_s=self.now,
                    error="prompt + max_tokens exceed max_model_len",
                )
            )
            self._end(active)
            return
        body = {
            "model": spec.model,
            "messages": list(active.messages),
            "max_tokens": session.max_tokens,
            "stream": True,
        }
        view = RequestView(request_id, "chat", spec.model, True, body, b"", session_key=session.session_id)
        if self.exact is not None:  # token keys, as a gateway with the model's tokenizer computes them
            system = len(self._encode_message(active.messages[0], cache=True)) if session.system else 0
            prefix.attach(view, prefix.from_tokens(view, self.prefix, TokenizedPrompt(tuple(prompt_ids), system)))
        self.routing_prompt = prompt_ids  # what the lab's oracle reads; a product policy sees only `view`
        candidates = [
            Candidate(r.name, 1.0, r.in_flight, r.running, r.waiting, r.kv_usage) for r in self.replicas.values()
        ]
        replica = self.replicas[run_sync(self.router.route(view, candidates)).replica_id]
        replica.in_flight += 1
        max_tokens = session.max_tokens
        request = Request(
            request_id,
            prompt_ids,
            SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            stub.block_size,
            eos_token_id=self.tokenizer.eos_token_id,
            arrival_time=self.now,
        )
        vocab = self._vocab_ids
        active.answer_ids = [vocab[i] for i in workloads.below(active.answer_rng, len(vocab), max_tokens)]
        active.view, active.replica, active.request = view, replica, request
        active.result = Result(
            session.session_id, active.turn, ok=False, scheduled_s=self.now, sent_s=self.now, replica=replica.name
        )
        self._by_request[request_id] = active
        replica.scheduler.add_request(request)
        if not replica.busy:
            self._step(replica)

    def _step(self, replica: SimReplica) -> None:
        if self.fast_forward:
            steps = replica.scheduler.decode_only_steps()
            if steps:
                running = list(replica.scheduler.running)
                replica.busy, replica.step = True, None
                replica.run = DecodeRun(running, [r.num_computed_tokens for r in running], steps, [self.now])
                self._decode_step(replica, replica.run)
                return
        out = replica.scheduler.schedule()
        replica.run = None
        if not out.scheduled:
            replica.busy, replica.step = False, None
            return
        replica.busy, replica.step = True, out
        engine = self.engine
        self._seq += 1
        replica.busy_until = self.now + engine.step_ms(out) / 1000 / engine.speedup
        heapq.heappush(self._heap, (replica.busy_until, self._seq, lambda: self._step_done(replica, out)))

    def _decode_step(self, replica: SimReplica, run: DecodeRun) -> None:
        """Start the run's next step: what `_step` does for it (the engine's cost of a decode-only step)."""
        done = len(run.times) - 1
        engine = self.engine
        step_ms = engine.timing.step_ms((), [context + done for context in run.contexts])
        self._seq += 1
        replica.busy_until = self.now + step_ms / 1000 / engine.speedup
        heapq.heappush(self._heap, (replica.busy_until, self._seq, lambda: self._decode_step_done(replica, run)))

    def _decode_step_done(self, replica: SimReplica, run: DecodeRun) -> None:
        run.times.append(self.now)
        if len(run.times) - 1 < run.steps and not replica.scheduler.waiting:
            self._decode_step(replica, run)  # the next step is a plain decode step too
            return
        # Bring the scheduler and the results to where `_step_done` would have left them after each step.
        every, times, by_request = self.spec.itl_every, run.times, self._by_request
        steps = len(times) - 1
        for request in run.requests:
            active = by_request[request.request_id]
            result = active.result
            assert result is not None and result.ttft_s is not None  # past its first token
            done = len(request.output_token_ids)
            replica.scheduler.advance_decode(request, active.answer_ids[done : done + steps])
            last = active.last_token_s
            for step in range(1, steps + 1):
                if (done + step) % every == 0:
                    result.itl_s.append(times[step] - last)
                last = times[step]
            active.last_token_s = last
        self._step(replica)

    def _step_done(self, replica: SimReplica, out: SchedulerOutput) -> None:
        by_request = self._by_request
        sampled = {}
        for s in out.scheduled:
            stepped = s.request
            if stepped.num_computed_tokens + s.num_new_tokens == len(stepped.all_token_ids):  # s.samples
                request_id = stepped.request_id
                sampled[request_id] = by_request[request_id].answer_ids[len(stepped.output_token_ids)]
        every, now = self.spec.itl_every, self.now
        for output in replica.scheduler.update_from_output(out, sampled):
            active = by_request[output.request_id]
            result, request = active.result, active.request
            assert result is not None and request is not None
            if result.ttft_s is None:
                result.ttft_s = now - result.sent_s
                assert active.view is not None
                self.router.first_token(active.view, replica.name)
            elif len(request.output_token_ids) % every == 0:
                result.itl_s.append(now - active.last_token_s)
            active.last_token_s = now
            if output.finish_reason is not None:
                self._finish(active, request)
        self._step(replica)

    def _finish(self, active: Active, request: Request) -> None:
        result, replica, view = active.result, active.replica, active.view
        assert result is not None and replica is not None and view is not None
        del self._by_request[request.request_id]
        active.request = None
        replica.in_flight -= 1
        result.ok, result.status, result.e2e_s = True, 200, self.now - result.sent_s
        result.prompt_tokens, result.completion_tokens = request.num_prompt_tokens, len(request.output_token_ids)
        result.cached_tokens = request.num_cached_tokens or 0
        answer = "".join(self._word[t] for t in request.output_token_ids)
        predicted = self.router.finished(
            view,
            replica.name,
            Outcome(
                ok=True,
                ttft_s=result.ttft_s,
                prompt_tokens=result.prompt_tokens,
                cached_tokens=result.cached_tokens,
                answer=answer if self.router.records_answers else None,
            ),
        )
        if predicted is not None and self.router.policy.needs_index:
            result.predicted_cached_tokens = predicted.cached_tokens
        self._record(result)
        active.messages.append({"role": "assistant", "content": answer})
        # The tokenizer is prefix-stable and the answer is whole vocabulary words, so the next turn's
        # prompt continues this request's tokens exactly, as the stub re-tokenizes it.
        active.token_ids = [*request.prompt_token_ids, *request.output_token_ids, *self._end_of_message]
        active.turn += 1
        session = active.session
        if active.turn < len(session.user_turns):
            self._at(self.now + session.think_s, lambda: self._send(active))
        else:
            self._end(active)

    def _record(self, result: Result) -> None:
        self.results.append(result)
        if self.on_result is not None:
            self.on_result(result)

    def _end(self, active: Active) -> None:
        del self._active[active.session.session_id]
        if self.spec.concurrency > 0:
            self._next_closed_loop()


def simulate(sessions: list[Session], spec: SimSpec, on_result: OnResult | None = None) -> list[Result]:
    return Simulation(spec, on_result).run(sessions)
