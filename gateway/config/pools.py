"""The config's `pools:` section: each model's replicas, routing, discovery and per-pool features.

pools.<model>:                PoolConfig
  replicas[]:                 ReplicaConfig (kv_events: KVEventsConfig)
  routing:                    RoutingConfig (prefix: PrefixConfig; params: gateway.config.policy_params)
  discovery:                  DiscoveryConfig (kubernetes: gateway.config.kubernetes)
  stream_chunking:            StreamChunkingConfig
  prices:                     PricesConfig
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field

from gateway.config.kubernetes import KubernetesDiscoveryConfig, Role
from gateway.config.policy_params import policy_config
from gateway.config.schema import Section
from gateway.config.secret_files import read_key
from gateway.config.sections import positive
from gateway.errors import ConfigError

_PER_MILLION = 1e6


_SCHEMES = ("tcp://", "ipc://", "inproc://")


class KVEventsConfig(Section):
    """YAML `kv_events` of one replica: where its engine publishes (vLLM `--kv-events-config`)."""

    endpoint: str  # e.g. tcp://10.0.0.5:5557 (the address to connect to, not vLLM's bind form tcp://*:5557)
    replay_endpoint: str | None = None
    topic: str = ""

    def check(self) -> None:
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is None:
                continue
            if not value.startswith(_SCHEMES):
                raise ConfigError(f"must start with one of {', '.join(_SCHEMES)}", key=name)
            if value.startswith("tcp://*"):
                raise ConfigError("needs the replica's address, not a bind wildcard", key=name)


DEFAULT_BLOCK_TOKENS = 16  # vLLM's default block size (its CPU backend uses 128)


class PrefixConfig(Section):
    """YAML `pools.<name>.routing.prefix`."""

    block_chars: int = 64  # ≈ 4 chars/token × vLLM's default block of 16 tokens
    chars_per_token: float = 4.0
    # The replica's KV block size: blocks of token keys. None: learned from the replicas
    # (vllm:cache_config_info, BlockStored events), vLLM's default 16 until then.
    block_tokens: int | None = None
    salt_by_tenant: bool = False
    max_blocks: int = 4096  # bounds hashing work per request (≈ 64k tokens at the defaults)
    # Token-exact keys: "replica" (the replicas' own /tokenize), "sim" (the replica stub's
    # simulator), a folder with the model's tokenizer.json (+ chat template), its .gguf, or
    # "model:smollm2"; None = character blocks.
    tokenizer: str | None = None
    tokenize_budget_ms: float = 50.0  # slower than this: character blocks for this request (counted)
    speculative_ttl_s: float = 2.0  # KV-event replicas: a dispatched prompt counts as cached this long

    def check(self) -> None:
        for name in ("block_chars", "block_tokens", "max_blocks"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError("must be at least 1", key=name)
        for name in ("chars_per_token", "tokenize_budget_ms", "speculative_ttl_s"):
            if getattr(self, name) <= 0:
                raise ConfigError("must be > 0", key=name)
        spec = self.tokenizer
        if (
            spec is not None
            and spec not in ("sim", "replica")
            and not spec.startswith("model:")
            and not Path(spec).expanduser().exists()
        ):
            raise ConfigError(
                f'{spec!r}: no such file or folder (expected "replica", "sim", "model:smollm2" '
                "or the path of the model's tokenizer.json, its folder or its .gguf)",
                key="tokenizer",
            )

    @property
    def block(self) -> int:
        """The token block size in use: the configured or learned one, else vLLM's default."""
        return self.block_tokens or DEFAULT_BLOCK_TOKENS

    @property
    def tokens_per_block(self) -> float:
        """Prompt tokens one character block stands for."""
        return self.block_chars / self.chars_per_token


class StreamChunkingConfig(Section):
    """YAML `pools.<model>.stream_chunking`; `X-Stream-Chunking: phrase` uses the pool's bounds."""

    mode: Literal["phrase", "none"] = "none"
    boundaries: str = ",.!?;:\n"  # each character ends a phrase (it stays at the phrase's end)
    max_wait_ms: float = 300.0  # pending text is sent this long after its first piece came, boundary or not
    max_chars: int = 200  # ...or once it is this long

    def check(self) -> None:
        if not self.boundaries:
            raise ConfigError("needs at least one boundary character", key="boundaries")
        if self.max_wait_ms <= 0:
            raise ConfigError(f"must be > 0, got {self.max_wait_ms}", key="max_wait_ms")
        if self.max_chars < 1:
            raise ConfigError(f"must be >= 1, got {self.max_chars}", key="max_chars")

    @cached_property
    def phrased(self) -> StreamChunkingConfig:
        """These bounds in phrase mode, for a request that asks for phrases: made once, not per request."""
        return self if self.mode == "phrase" else self.model_copy(update={"mode": "phrase"})


class PricesConfig(Section):
    """YAML `pools.<model>.prices`: money per million tokens (one currency for every pool)."""

    input: float
    cached_input: float
    output: float

    def check(self) -> None:
        for name in ("input", "cached_input", "output"):
            if getattr(self, name) < 0:
                raise ConfigError(f"must be >= 0, got {getattr(self, name)}", key=name)
        if self.cached_input > self.input:
            raise ConfigError(
                f"must not exceed input ({self.input:g}): a cache hit is never dearer", key="cached_input"
            )

    def cost(self, prompt: int, cached: int, completion: int) -> float:
        return ((prompt - cached) * self.input + cached * self.cached_input + completion * self.output) / _PER_MILLION

    def saved(self, cached: int) -> float:
        return cached * (self.input - self.cached_input) / _PER_MILLION


class ReplicaConfig(Section):
    url: str
    name: str = ""  # defaults to host:port of `url`
    weight: float = 1.0
    kv_events: KVEventsConfig | None = None  # the replica's ZMQ KV-event feed: exact cache state
    api_key_env: str | None = None  # this replica's own key (vLLM --api-key), over the pool's
    api_key_file: str | None = None
    adapters: tuple[str, ...] = ()  # LoRA adapters this replica serves (gateway.routing.adapters)
    role: Role = "both"  # for later prefill/decode splits: shown in /admin and metrics, not yet routed on

    def check(self) -> None:
        read_key(self.api_key_env, self.api_key_file, "")
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"expected an http(s) URL like http://10.0.0.5:8000, got {self.url!r}", key="url")
        if self.weight <= 0:
            raise ConfigError(f"weight must be > 0, got {self.weight}", key="weight")

    @property
    def replica_id(self) -> str:
        return self.name or urlsplit(self.url).netloc


class RoutingConfig(Section):
    policy: str = "prefix_affinity"  # the product's reason to exist is the default
    params: dict[str, Any] = Field(default_factory=dict)
    prefix: PrefixConfig = Field(default_factory=PrefixConfig)  # how prompts are hashed, for prefix policies
    explain_header: bool = False  # add X-Gateway-Route (each candidate's score) to every response

    def check(self) -> None:
        policy_config(self.policy, self.params, "")  # the name and its parameters


class DiscoveryConfig(Section):
    """YAML `pools.<model>.discovery`: replicas from a DNS name's A/AAAA records (a headless Service),
    or from the Kubernetes API (`kubernetes`); exactly one of the two.

    Every DNS address becomes replica `<address>:<port>`, re-resolved every `interval_s`; every
    Kubernetes endpoint becomes replica `<pod name>`, followed as the watch reports it.
    """

    dns: str | None = None
    kubernetes: KubernetesDiscoveryConfig | None = None
    port: int = 8000
    interval_s: float = 5.0
    scheme: Literal["http", "https"] = "http"
    weight: float = 1.0
    kv_events_port: int | None = None  # each replica publishes KV events on tcp://<address>:<this port>
    kv_events_replay_port: int | None = None  # ...and answers replays on this one

    @property
    def source(self) -> str:
        """Where the replicas come from, for log lines."""
        if self.kubernetes is not None:
            k8s = self.kubernetes
            where = k8s.service or ",".join(f"{k}={v}" for k, v in sorted(k8s.labels.items())) or k8s.pool_label
            return f"kubernetes:{k8s.namespace or '-'}/{where}"
        return f"dns:{self.dns}"

    def check(self) -> None:
        if (self.dns is None) == (self.kubernetes is None):
            raise ConfigError(
                "set exactly one of `dns` and `kubernetes`",
                key="kubernetes" if self.kubernetes is not None else "dns",
            )
        if self.dns is not None and (not self.dns or "/" in self.dns or ":" in self.dns):
            raise ConfigError(f"expected a host name like replicas.default.svc, got {self.dns!r}", key="dns")
        for name in ("port", "kv_events_port", "kv_events_replay_port"):
            port = getattr(self, name)
            if port is not None and not 1 <= port <= 65535:
                raise ConfigError(f"port must be 1..65535, got {port}", key=name)
        if self.kv_events_replay_port is not None and self.kv_events_port is None:
            raise ConfigError("a replay port needs kv_events_port", key="kv_events_replay_port")
        positive(self, "interval_s", "weight")


_EVENTS_NEED_TOKENS = "KV events carry token ids: set routing.prefix.tokenizer so requests are keyed by the same tokens"


class PoolConfig(Section):
    replicas: tuple[ReplicaConfig, ...] = ()
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    discovery: DiscoveryConfig | None = None  # adds the replicas DNS or the Kubernetes API finds
    api_key_env: str | None = None  # the replicas' key (vLLM --api-key), sent as Authorization: Bearer
    api_key_file: str | None = None
    aliases: tuple[str, ...] = ()  # more names for this pool: exact, or wildcard patterns (gateway.routing.model_names)
    adapters: tuple[str, ...] = ()  # LoRA adapters every replica of the pool serves (gateway.routing.adapters)
    stream_chunking: StreamChunkingConfig = Field(default_factory=StreamChunkingConfig)  # phrases for voice agents
    stream_usage: bool = True  # ask for usage on every stream, dropped before the client (gateway.relay.stream_usage)
    prices: PricesConfig | None = None  # money per million tokens: cost, cache savings (gateway.insights.token_costs)

    @cached_property
    def _backend_keys(self) -> tuple[str | None, dict[str, str]]:
        """Read once per loaded config (validated at load): the pool's key and each replica's own."""
        own = {r.replica_id: k for r in self.replicas if (k := read_key(r.api_key_env, r.api_key_file, "")) is not None}
        return read_key(self.api_key_env, self.api_key_file, ""), own

    def backend_key(self, replica_id: str) -> str | None:
        """The key to send to this replica, if its pool or itself has one."""
        pool_key, own = self._backend_keys
        return own.get(replica_id, pool_key)

    @property
    def has_kv_events(self) -> bool:
        """Whether any replica (static or discovered) publishes KV events."""
        return any(r.kv_events is not None for r in self.replicas) or (
            self.discovery is not None and self.discovery.kv_events_port is not None
        )

    def check(self) -> None:
        read_key(self.api_key_env, self.api_key_file, "")
        if not self.replicas and self.discovery is None:
            raise ConfigError("a pool needs at least one replica (or `discovery`)", key="replicas")
        seen: set[str] = set()
        for i, replica in enumerate(self.replicas):
            if replica.replica_id in seen:
                raise ConfigError(
                    f"duplicate replica {replica.replica_id!r} (give each a distinct name)", key=f"replicas[{i}]"
                )
            seen.add(replica.replica_id)
            if replica.kv_events is not None and self.routing.prefix.tokenizer is None:
                raise ConfigError(_EVENTS_NEED_TOKENS, key=f"replicas[{i}].kv_events")
        if (
            self.discovery is not None
            and self.discovery.kv_events_port is not None
            and self.routing.prefix.tokenizer is None
        ):
            raise ConfigError(_EVENTS_NEED_TOKENS, key="discovery.kv_events_port")
        self._backend_keys  # noqa: B018 - read the key files now, at load, not on the event loop at the first request


__all__ = [
    "DEFAULT_BLOCK_TOKENS",
    "DiscoveryConfig",
    "KVEventsConfig",
    "PoolConfig",
    "PrefixConfig",
    "PricesConfig",
    "ReplicaConfig",
    "RoutingConfig",
    "StreamChunkingConfig",
]
