"""Prometheus metrics under vLLM's names (label `model_name`, plus `engine`="0"), each defined
once, in a registry owned by the app so several replicas can live in one process (tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from replica_stub.config import StubConfig
from replica_stub.request import Request
from replica_stub.scheduler import Scheduler

LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)


class StubMetrics:
    def __init__(self, config: StubConfig, scheduler: Scheduler) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total etc., as vLLM exposes
        labels = {"model_name": config.model, "engine": "0"}
        names = list(labels)
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=reg)

        running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        running.labels(**labels).set_function(lambda: scheduler.num_running)
        waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        waiting.labels(**labels).set_function(lambda: scheduler.num_waiting)
        usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        usage.labels(**labels).set_function(scheduler.kv.usage)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=reg).labels(**labels)

        self.prefix_cache_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of tokens.")
        self.prefix_cache_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of tokens.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.num_preemptions = counter("vllm:num_preemptions", "Cumulative number of preemptions.")
        self.request_success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=reg,
        )
        for reason in ("stop", "length", "abort"):  # at 0 from the start, as vLLM's: a restart shows as a drop
            self.request_success.labels(**labels, finished_reason=reason)
        self._labels = labels

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, names, buckets=LATENCY_BUCKETS, registry=reg).labels(**labels)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.")
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.")
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."
        )
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMCache",
            ["block_size", "num_gpu_blocks", "enable_prefix_caching"],
            registry=reg,
        )
        info.labels(
            block_size=str(config.block_size), num_gpu_blocks=str(config.num_gpu_blocks), enable_prefix_caching="True"
        ).set(1)
        self.loop_lag = Histogram(
            "replica_stub_event_loop_lag_seconds",
            "How late the replica's event loop ran a periodic probe.",
            buckets=LAG_BUCKETS,
            registry=reg,
        )
        self.loop_lag_max = Gauge(
            "replica_stub_event_loop_lag_max_seconds", "Largest event-loop lag seen since start.", registry=reg
        )
        self._loop_lag_max = 0.0
        self._preemptions_seen = 0
        self._scheduler = scheduler

    def on_admitted(self, request: Request, now: float) -> None:
        cached = request.num_cached_tokens or 0
        self.prefix_cache_queries.inc(request.num_tokens)
        self.prefix_cache_hits.inc(cached)
        self.prompt_tokens.inc(request.num_prompt_tokens)
        self.queue_time.observe(now - request.arrival_time)

    def on_step(self, num_generated: int) -> None:
        self.generation_tokens.inc(num_generated)
        preemptions = self._scheduler.num_preemptions
        if preemptions > self._preemptions_seen:
            self.num_preemptions.inc(preemptions - self._preemptions_seen)
            self._preemptions_seen = preemptions

    def on_first_token(self, request: Request, now: float) -> None:
        self.ttft.observe(now - request.arrival_time)

    def on_finished(self, request: Request, reason: str, now: float) -> None:
        self.e2e.observe(now - request.arrival_time)
        self.request_success.labels(**self._labels, finished_reason=reason).inc()

    def on_loop_lag(self, lag_s: float) -> None:
        self.loop_lag.observe(lag_s)
        if lag_s > self._loop_lag_max:
            self._loop_lag_max = lag_s
            self.loop_lag_max.set(lag_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
