"""The simulated engine: spends each step's modelled time with `asyncio.sleep` and samples
whole words, so one CPU core can host many replicas that still behave like real ones.

Text is a deterministic function of (seed, LoRA adapter, prompt): each request gets its own RNG seeded
from both, and a natural length after which it emits EOS (unless `ignore_eos`). Every word
is at most 8 characters and is followed by a space, so it is a single tokenizer piece and
the answer re-tokenizes to the generated ids when it comes back in the next turn.
"""

from __future__ import annotations

import asyncio
import random
import time
from array import array

import xxhash

from replica_stub.engine.base import Tokenizer
from replica_stub.engine.timing import TimingModel
from replica_stub.request import Request
from replica_stub.scheduler import SchedulerOutput
from replica_stub.tokenizer import SimTokenizer

WORDS = (
    "the of and to in is it you that he was for on are with as his they be at one have this "
    "from or had by hot word but what some we can out other were all there when up use your "
    "how said an each she which do their time if will way about many then them write would "
    "like so these her long make thing see him two has look more day could go come did number "
    "sound no most people my over know water than call first who may down side been now find "
    "any new work part take get place made live where after back little only round man year "
    "came show every good me give our under name very through just form great think say help "
    "low line before turn cause same mean differ move right boy old too does tell sentence set "
    "three want air well also play small end put home read hand port large spell add even land "
    "here must big high such follow act why ask men change went light kind off need house "
    "picture try us again animal point mother world near build self earth father head stand "
    "own page should country found answer school grow study still learn plant cover food sun "
    "four thought let keep eye never last door between city tree cross since hard start might "
    "story saw far sea draw left late run while press close night real life few stop open seem"
).split()


class SimEngine:
    name = "sim"

    def __init__(self, timing: TimingModel, *, speedup: float = 1.0, output_len: tuple[int, int] = (16, 256)) -> None:
        if speedup <= 0:
            raise ValueError("speedup must be > 0")
        self.timing, self.speedup, self.output_len = timing, speedup, output_len
        self.vocab = [w + " " for w in WORDS]
        self.tokenizer: Tokenizer = SimTokenizer(self.vocab)
        self._vocab_ids = [self.tokenizer.encode(w)[0] for w in self.vocab]
        self._rngs: dict[str, tuple[random.Random, int]] = {}
        self._deadline = 0.0

    @property
    def step_ends_at(self) -> float:
        """When (time.monotonic) the step in flight ends, by the modelled time it was given."""
        return self._deadline

    async def execute(self, step: SchedulerOutput) -> dict[str, int]:
        for request_id in step.finished_request_ids:
            self._rngs.pop(request_id, None)
        await self._spend(self.step_ms(step))
        return {s.request.request_id: self._sample(s.request) for s in step.scheduled if s.samples}

    def step_ms(self, step: SchedulerOutput) -> float:
        prefills, decodes = [], []
        for s in step.scheduled:
            request, num_new = s.request, s.num_new_tokens
            num_computed = request.num_computed_tokens
            if num_new == 1 and num_computed >= len(request.prompt_token_ids):
                decodes.append(num_computed)
            else:
                prefills.append((num_new, num_computed))
        return self.timing.step_ms(prefills, decodes)

    async def _spend(self, modelled_ms: float) -> None:
        """Sleep the scaled step time, measured from the end of the previous step so the
        loop's own overhead is absorbed instead of slowing the simulated hardware down."""
        now = time.monotonic()
        self._deadline = max(self._deadline, now) + modelled_ms / 1000 / self.speedup
        await asyncio.sleep(self._deadline - now)

    def _sample(self, request: Request) -> int:
        state = self._rngs.get(request.request_id)
        if state is None:
            seed = xxhash.xxh3_64_intdigest(
                array("Q", request.prompt_token_ids).tobytes(), seed=(request.sampling.seed or 0) ^ request.hash_root
            )
            rng = random.Random(seed)
            state = self._rngs[request.request_id] = (rng, rng.randint(*self.output_len))
        rng, natural_len = state
        if not request.sampling.ignore_eos and len(request.output_token_ids) + 1 >= natural_len:
            return self.tokenizer.eos_token_id
        return self._vocab_ids[rng.randrange(len(self._vocab_ids))]

    async def close(self) -> None:
        self._rngs.clear()
