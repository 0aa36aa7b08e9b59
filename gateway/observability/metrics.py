"""Every Prometheus metric of the gateway, defined once, on a per-app registry (no global state).

Replica state (in-flight, health, scraped load) is read from the pools at scrape time by a
collector, so the gauges can never drift from the counts the router uses.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.index.exact import ExactTables
from gateway.index.kv_events.subscriber import KVEventSubscriber
from gateway.observability.metric_children import Children
from gateway.observability.routing_metrics import RoutingMetrics
from gateway.observability.usage_checks import CachedTokensCheck
from gateway.replicas import ReplicaPool
from gateway.replicas.breaker import STATE_VALUES

# No `_created` series beside every counter and histogram: twice the series for a timestamp no query uses
# (vLLM's and llm-d's exporters leave it out too). prometheus_client's switch is process-wide.
disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TOKENS_PER_S = (1, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2500, 5000)
_ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Children(
            Counter(
                "affinity_gateway_requests",
                "Requests answered, by final replica and status",
                ["model_name", "replica", "status"],
                registry=r,
            )
        )
        self.ttft = Children(
            Histogram(
                "affinity_gateway_ttft_seconds",
                "Time to the first upstream body byte",
                ["model_name"],
                buckets=_LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.first_phrase = Children(
            Histogram(
                "affinity_gateway_first_phrase_seconds",
                "Time to the first phrase written to the client, streams chunked in phrases only",
                ["model_name"],
                buckets=_LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.tokens_per_s = Children(
            Histogram(
                "affinity_gateway_tokens_per_second",
                "A stream's completion tokens over its decode time (after the first byte)",
                ["model_name"],
                buckets=_TOKENS_PER_S,
                registry=r,
            )
        )
        self.itl = Children(
            Histogram(
                "affinity_gateway_inter_token_latency_seconds",
                "A stream's mean time between tokens: decode time over completion tokens - 1",
                ["model_name"],
                buckets=_ITL_BUCKETS,
                registry=r,
            )
        )
        self.latency = Children(
            Histogram(
                "affinity_gateway_request_duration_seconds",
                "Whole request, gateway in to out",
                ["model_name"],
                buckets=_LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.retries = Children(
            Counter(
                "affinity_gateway_retries",
                "Attempts re-sent to another replica before the first byte",
                ["model_name"],
                registry=r,
            )
        )
        self.upstream_errors = Children(
            Counter("affinity_gateway_upstream_errors", "Upstream faults by kind", ["replica", "kind"], registry=r)
        )
        self.poison_requests = Counter(
            "affinity_gateway_poison_requests",
            "Requests answered 5xx by two replicas: the input's fault, charged to no breaker",
            registry=r,
        )
        self.reloads = Counter("affinity_gateway_config_reloads", "Config reloads by result", ["result"], registry=r)
        self.rejected = Children(
            Counter(
                "affinity_gateway_rejected",
                "Requests refused before routing, by reason (auth, limit, rate_limit, queue)",
                ["model_name", "reason"],
                registry=r,
            )
        )
        self.queue_wait = Children(
            Histogram(
                "affinity_gateway_queue_wait_seconds",
                "Time spent in the admission queue",
                ["model_name"],
                buckets=_LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.queue_waiting = Gauge(
            "affinity_gateway_queue_waiting", "Requests waiting for a replica slot now", ["model_name"], registry=r
        )
        self.tenant_queue_waiting = Gauge(
            "affinity_gateway_tenant_queue_waiting",
            "Requests waiting for a slot now, by tenant (only tenants with a waiter)",
            ["model_name", "tenant"],
            registry=r,
        )
        self.admission_borrowed = Counter(
            "affinity_gateway_admission_borrowed",
            "Requests admitted past max_in_flight_per_replica: a tenant under its fair share of a full pool",
            ["model_name", "tenant"],
            registry=r,
        )
        self.tenant_requests = Children(
            Counter(
                "affinity_gateway_tenant_requests",
                "Requests by API-key tenant and status",
                ["tenant", "status"],
                registry=r,
            )
        )
        self.tenant_tokens = Children(
            Counter(
                "affinity_gateway_tenant_tokens",
                "Tokens by tenant, as the replicas reported",
                ["tenant", "kind"],
                registry=r,
            )
        )
        self.response_homes = Children(
            Counter(
                "affinity_gateway_response_home_lookups",
                "Responses API follow-ups "
                "by where their response's home was found: local, redis, replicas "
                "(asked in turn), unknown",
                ["source"],
                registry=r,
            )
        )
        self.draining = Gauge("affinity_gateway_draining", "1 after SIGTERM while accepted requests finish", registry=r)
        self.routing = RoutingMetrics(r)  # decisions by policy and reason, routing time, prediction error
        self.cached_tokens_check = CachedTokensCheck(r)  # warns when replicas never report cached tokens

    def watch(self, pools: Callable[[], Iterable[ReplicaPool]]) -> None:
        """Export the replicas of these pools (read at every scrape)."""
        self.registry.register(_PoolCollector(pools))

    def watch_feeds(self, feeds: Callable[[], Iterable[tuple[str, str, KVEventSubscriber, ExactTables]]]) -> None:
        """Export the KV-event subscribers and their exact tables (read at every scrape)."""
        self.registry.register(_FeedCollector(feeds))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _PoolCollector(Collector):
    def __init__(self, pools: Callable[[], Iterable[ReplicaPool]]) -> None:
        self._pools = pools

    def collect(self) -> Iterator[Metric]:
        labels = ["model_name", "replica"]
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "in_flight": GaugeMetricFamily(
                "affinity_gateway_replica_in_flight", "Requests this gateway has at the replica now", labels=labels
            ),
            "healthy": GaugeMetricFamily(
                "affinity_gateway_replica_healthy",
                "1 when the replica takes traffic (probes pass, not ejected)",
                labels=labels,
            ),
            "running": GaugeMetricFamily("affinity_gateway_replica_running", "Scraped running requests", labels=labels),
            "waiting": GaugeMetricFamily("affinity_gateway_replica_waiting", "Scraped waiting requests", labels=labels),
            "kv_usage": GaugeMetricFamily(
                "affinity_gateway_replica_kv_usage", "Scraped KV-cache usage 0..1", labels=labels
            ),
            "breaker": GaugeMetricFamily(
                "affinity_gateway_replica_breaker_state",
                "Circuit breaker: 0 closed, 1 half-open, 2 open",
                labels=labels,
            ),
            "opened": CounterMetricFamily(
                "affinity_gateway_replica_breaker_opened", "Times the circuit breaker opened", labels=labels
            ),
        }
        info = GaugeMetricFamily(
            "affinity_gateway_replica_info",
            "1 per replica, its role (prefill, decode, both) as a label: join on it rather than widen every series",
            labels=[*labels, "role"],
        )
        now = time.monotonic()
        for pool in self._pools():
            for replica in pool:
                key = [pool.model, replica.replica_id]
                info.add_metric([*key, replica.role], 1.0)
                families["in_flight"].add_metric(key, replica.in_flight)
                families["healthy"].add_metric(key, float(replica.is_available()))
                families["running"].add_metric(key, replica.load.running)
                families["waiting"].add_metric(key, replica.load.waiting)
                families["kv_usage"].add_metric(key, replica.load.kv_usage)
                families["breaker"].add_metric(key, STATE_VALUES[replica.breaker.state(now)])
                families["opened"].add_metric(key, replica.breaker.opened_total)
        yield from families.values()
        yield info


class _FeedCollector(Collector):
    """Each KV-event feed's health (certain, gaps, replays, restarts seen) and its table's size."""

    _COUNTERS = (
        ("batches", "Event batches applied"),
        ("gaps", "Sequence gaps seen"),
        ("replays", "Replay requests sent to fill a gap or rebuild"),
        ("replay_failures", "Replays that timed out or could not fill the gap"),
        ("resets", "Publisher restarts seen (sequence went back): table rebuilt"),
        ("decode_errors", "Batches that did not decode"),
        ("paced_seconds", "Seconds the feed rested mid-batch to leave the CPU to requests (a flood of events)"),
    )

    def __init__(self, feeds: Callable[[], Iterable[tuple[str, str, KVEventSubscriber, ExactTables]]]) -> None:
        self._feeds = feeds

    def collect(self) -> Iterator[Metric]:
        labels = ["model_name", "replica"]
        certain = GaugeMetricFamily(
            "affinity_gateway_kv_events_certain",
            "1 while the replica's exact table is known to mirror its KV cache (else routing also consults history)",
            labels=labels,
        )
        blocks = GaugeMetricFamily(
            "affinity_gateway_kv_events_blocks", "Blocks the replica holds, from its KV events", labels=labels
        )
        counters = {
            name: CounterMetricFamily(f"affinity_gateway_kv_events_{name}", text, labels=labels)
            for name, text in self._COUNTERS
        }
        for model, replica_id, feed, exact in self._feeds():
            key = [model, replica_id]
            certain.add_metric(key, float(exact.certain(replica_id)))
            blocks.add_metric(key, exact.size(replica_id))
            for name, family in counters.items():
                family.add_metric(key, getattr(feed, name))
        yield certain
        yield blocks
        yield from counters.values()
