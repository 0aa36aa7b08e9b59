"""The lab's oracle in front of live stubs: the sim stub's own TTFT forecast (`POST /debug/forecast_ttft`)
and `python -m lab.oracle_router`, which routes by it. Real processes on loopback ports."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from lab import peers
from lab.benchmark import bench_compare
from lab.cluster import ClusterSpec
from replica_stub.engine.timing import TimingModel
from tests.helpers import Proc, free_port, python_module, wait_http

pytestmark = pytest.mark.timeout(120)
MODEL = "stub-model"
BLOCK = 16


class Processes:
    """Processes of one test, each on a free loopback port; stopped at teardown."""

    def __init__(self) -> None:
        self.by_url: dict[str, Proc] = {}

    def __call__(self, module: str, *flags: str, ready: str | None = "/health") -> str:
        """Start `module`; its base URL once `ready` answers 200 (None: once it answers at all)."""
        port = free_port()
        proc = Proc(python_module(module, "--port", str(port), *flags))
        url = f"http://127.0.0.1:{port}"
        self.by_url[url] = proc
        if ready is not None:
            wait_http(f"{url}{ready}", proc, timeout=60)
            return url
        deadline = time.monotonic() + 60
        while True:
            assert proc.alive() and time.monotonic() < deadline, proc.output()[-2000:]
            try:
                httpx.get(url, timeout=5)
                return url
            except httpx.TransportError:
                time.sleep(0.1)


@pytest.fixture
def start() -> Iterator[Processes]:
    processes = Processes()
    yield processes
    for proc in processes.by_url.values():
        proc.stop()


def stub(start: Processes, name: str, *flags: str, speedup: float = 1) -> str:
    return start(
        "replica_stub",
        *("--model", MODEL, "--engine", "sim", "--speedup", str(speedup), "--replica-id", name),
        *("--block-size", str(BLOCK), "--log-level", "warning", *flags),
    )


def words(n: int, salt: str) -> str:
    return " ".join(f"{salt}{i % 97}" for i in range(n))


@contextmanager
def long_prompts_sent(url: str, n: int) -> Iterator[None]:
    """`n` cold 1,500-word prompts sent to `url` at once, each from its own thread; all answered at the end."""
    senders = [
        threading.Thread(
            target=httpx.post,
            args=(f"{url}/v1/completions",),
            kwargs={"json": {"model": MODEL, "prompt": words(1500, f"q{i}-"), "max_tokens": 4}, "timeout": 60},
        )
        for i in range(n)
    ]
    for sender in senders:
        sender.start()
    try:
        yield
    finally:
        for sender in senders:
            sender.join()


def forecast(url: str, prompt: str) -> dict[str, float]:
    answer = httpx.post(f"{url}/debug/forecast_ttft", json={"model": MODEL, "prompt": prompt}, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_stub_forecasts_its_own_ttft_from_its_cache_and_its_queue(start: Processes) -> None:
    url = stub(start, "a")
    prompt = words(400, "w")
    cold = forecast(url, prompt)
    assert cold["cached_tokens"] == 0 and cold["running"] == cold["waiting"] == 0
    n = int(cold["prompt_tokens"])
    assert cold["ttft_s"] == pytest.approx(TimingModel().solo_prefill_ms(n) / 1000, rel=1e-6), "idle: one prefill"
    served = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}, timeout=30)
    assert served.status_code == 200
    warm = forecast(url, prompt)
    assert warm["cached_tokens"] == (n - 1) // BLOCK * BLOCK
    assert warm["ttft_s"] < cold["ttft_s"] / 4, "a warm prompt prefills its last block only"

    # Six long cold prompts in the queue: the forecast replays their prefills (and their batch) first.
    with long_prompts_sent(url, 6):
        busy = forecast(url, prompt)
        for _ in range(100):  # until the stub holds the load
            if busy["running"] + busy["waiting"] >= 6:
                break
            busy = forecast(url, prompt)
        assert busy["running"] + busy["waiting"] >= 6
        assert busy["ttft_s"] > 1.0 > cold["ttft_s"], busy


def test_a_forecast_asks_a_request_the_stub_could_serve_on_the_sim_engine(start: Processes) -> None:
    url = stub(start, "a")
    answer = httpx.post(f"{url}/debug/forecast_ttft", json={"model": MODEL}, timeout=10)
    assert answer.status_code == 400
    assert answer.json()["error"]["type"] == "BadRequestError"
    real = start("replica_stub", "--model", MODEL, "--engine", "real", "--log-level", "warning")  # the real model
    answer = httpx.post(f"{real}/debug/forecast_ttft", json={"model": MODEL, "prompt": "hello"}, timeout=10)
    assert answer.status_code == 404 and "sim engine" in answer.json()["error"]["message"]


def test_the_oracle_router_sends_a_prompt_where_its_first_token_comes_soonest(start: Processes) -> None:
    a, b = stub(start, "a"), stub(start, "b")
    router = start("lab.oracle_router", "--worker-urls", a, b, ready="/v1/models")
    prompt = words(400, "p")
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    assert httpx.post(f"{b}/v1/completions", json=body, timeout=30).status_code == 200  # warm on b only
    with httpx.Client(base_url=router, timeout=60) as http:
        assert http.post("/v1/completions", json=body).headers["X-Replica-Id"] == "b", "the warm replica"
        chat = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 2, "stream": True}
        streamed = http.post("/v1/chat/completions", json=chat)
        assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
        assert http.get("/v1/models").json()["data"][0]["id"] == MODEL

        # b busy with eight long cold prompts: a cold prefill on a is sooner than b's queue.
        with long_prompts_sent(b, 8):
            for _ in range(100):
                if forecast(b, prompt)["ttft_s"] > 2 * forecast(a, prompt)["ttft_s"]:
                    break
            assert http.post("/v1/completions", json=body).headers["X-Replica-Id"] == "a", "away from b's queue"


def test_the_oracle_router_skips_a_replica_that_cannot_forecast_and_relays_a_refusal(start: Processes) -> None:
    a = stub(start, "a")
    gone = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    router = start("lab.oracle_router", "--worker-urls", a, gone, ready="/health")
    body = {"model": MODEL, "prompt": words(50, "s"), "max_tokens": 2}
    with httpx.Client(base_url=router, timeout=30) as http:
        assert all(http.post("/v1/completions", json=body).headers["X-Replica-Id"] == "a" for _ in range(3))
        bad = http.post("/v1/completions", json={"model": MODEL, "max_tokens": 2})  # no prompt
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "BadRequestError", "the replica's refusal"
        assert bad.headers["X-Replica-Id"] == "a"
    alone = start("lab.oracle_router", "--worker-urls", gone, ready=None)
    answer = httpx.post(f"{alone}/v1/completions", json=body, timeout=30)
    assert answer.status_code == 503 and answer.json()["error"]["type"] == "ServiceUnavailableError"


def test_the_oracle_router_breaks_the_answer_of_a_replica_that_dies_mid_stream(start: Processes) -> None:
    """Not a short answer that looks complete: the client's connection drops."""
    a = stub(start, "a", speedup=0.5)
    router = start("lab.oracle_router", "--worker-urls", a, ready="/health")
    body = {"model": MODEL, "prompt": words(20, "d"), "max_tokens": 500, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=30) as http, http.stream("POST", f"{router}/v1/completions", json=body) as answer:
        assert answer.status_code == 200
        chunks = answer.iter_raw()
        assert next(chunks).startswith(b"data: ")
        start.by_url[a].kill()
        with pytest.raises(httpx.RemoteProtocolError):
            for _ in chunks:
                pass


def test_bench_names_the_oracle_and_keeps_it_to_sim_stubs() -> None:
    entry = peers.contestant("oracle")
    assert entry.peer is peers.ORACLE and entry.peer.installed() and entry.policy == "engine"
    assert entry.peer.command("engine", 1, ["http://x"], 2)[1:3] == ["-m", "lab.oracle_router"]
    with pytest.raises(ValueError, match="needs --engine sim"):
        bench_compare(["oracle"], [], ClusterSpec(engine="vllm"))
