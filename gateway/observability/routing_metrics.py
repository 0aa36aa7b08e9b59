"""Prometheus series for routing decisions: why each request went where, and how right we were.

Defined once here and passed to `Router`; the server registers them in its CollectorRegistry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.observability.metric_children import Children

_TOKENS = (0, 16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
_ERROR_TOKENS = (-8192, -2048, -512, -128, -16, 0, 16, 128, 512, 2048, 8192)
_ERROR_S = (-2.0, -0.5, -0.1, -0.025, 0.0, 0.025, 0.1, 0.5, 2.0)


class RoutingMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Children(
            Counter(
                "affinity_gateway_route_decisions_total",
                "Routing decisions by policy and reason",
                ["model_name", "policy", "reason"],
                registry=registry,
            )
        )
        self.matched_tokens = Children(
            Histogram(
                "affinity_gateway_route_matched_prefix_tokens",
                "Warm-prefix tokens the index predicted on the chosen replica",
                ["model_name"],
                buckets=_TOKENS,
                registry=registry,
            )
        )
        self.cached_error = Children(
            Histogram(
                "affinity_gateway_route_cached_tokens_error_tokens",
                "Predicted minus replica-reported "
                "cached prompt tokens on the chosen replica, by the evidence the prediction used",
                ["model_name", "evidence"],
                buckets=_ERROR_TOKENS,
                registry=registry,
            )
        )
        self.evidence = Children(
            Counter(
                "affinity_gateway_route_evidence_total",
                "Routing decisions by the evidence behind the chosen "
                "replica's warm prefix: events, speculative, history or characters",
                ["model_name", "evidence"],
                registry=registry,
            )
        )
        self.tokenize_fallbacks = Children(
            Counter(
                "affinity_gateway_tokenize_fallback_total",
                "Requests keyed by character blocks because the tokenizer failed or exceeded its budget",
                ["model_name"],
                registry=registry,
            )
        )
        self.ttft_error = Children(
            Histogram(
                "affinity_gateway_route_ttft_error_seconds",
                "Predicted minus observed time to first token",
                ["model_name"],
                buckets=_ERROR_S,
                registry=registry,
            )
        )
        self.route_seconds = Children(
            Histogram(
                "affinity_gateway_route_seconds",
                "Time to hash, look up and choose a replica",
                ["model_name"],
                buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05),
                registry=registry,
            )
        )
        self.block_tokens_mismatch = Gauge(
            "affinity_gateway_block_tokens_mismatch",
            "The replica's KV block size (from cache_config_info "
            "or its KV events) while it differs from the configured routing.prefix.block_tokens, else 0: "
            "token keys then never match its blocks",
            ["model_name", "replica"],
            registry=registry,
        )
        self.index_degraded = Children(
            Gauge(
                "affinity_gateway_index_degraded",
                "1 while the shared warm-prefix store is unreachable and routing uses the local table",
                ["model_name"],
                registry=registry,
            )
        )
        self.index_mirror_synced = Gauge(
            "affinity_gateway_index_mirror_synced",
            "1 while this gateway's in-memory mirror of the "
            "shared store follows every write, so lookups need no Redis round trip",
            ["model_name"],
            registry=registry,
        )
        self.index_fallbacks = Children(
            Counter(
                "affinity_gateway_index_fallback_total",
                "Lookups answered from the local table because the shared store was unreachable",
                ["model_name"],
                registry=registry,
            )
        )
