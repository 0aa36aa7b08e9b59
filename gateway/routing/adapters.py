"""LoRA adapters: which pool a request naming an adapter belongs to, and which replicas serve it.

    pools:
      llama:
        adapters: [sql-lora]            # served by every replica of the pool
        replicas:
          - url: http://10.0.0.5:8000
            adapters: [chat-lora]       # served by this replica only

vLLM serves an adapter under its own name (`--enable-lora --lora-modules name=path`) next to the
base model and selects it by the request's `model`, so a request for an adapter keeps that name on
its way (it is never renamed to the pool's, unlike an alias) and goes only to replicas that have it
loaded. Those are the declared ones above (or in a discovered pod's Kubernetes labels,
`gateway.config.kubernetes`), plus the discovered ones: each replica's `/v1/models`
lists its adapters with `parent` = the base model (`gateway.replicas.models`, refreshed at the
health probes' interval; a replica that stops answering keeps its last list). A discovered name that
is a pool or an exact alias stays theirs; a name two pools serve is the first pool's.

Within the replicas serving it the pool's policy chooses as for any request: the others are
excluded before it scores (`excluded`), so routing stays cache-aware among them; the prefix keys are
salted by the adapter (`gateway.prompt.prefix_keys`), so no prediction counts another adapter's blocks. Metrics
keep the pool's name as label. An adapter that no replica lists and none declares is an unknown
model (404); a known one whose replicas are all down or ejected gets 503 with Retry-After.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.routing.model_names import renamed
from gateway.view import RequestView

if TYPE_CHECKING:
    from gateway.config.loader import Config
    from gateway.routing.model_route import ModelRoute


@dataclass(frozen=True)
class AdapterMap:
    """One snapshot of every pool's adapters; rebuilt when the config or a replica's list changes."""

    pool_of: dict[str, str] = field(default_factory=dict)  # adapter -> its pool
    servers: dict[str, frozenset[str] | None] = field(default_factory=dict)  # replica ids; None: every replica
    roots: dict[str, dict[str, str | None]] = field(default_factory=dict)  # pool -> adapter -> path, if listed

    @classmethod
    def build(cls, config: Config, routes: Mapping[str, ModelRoute]) -> AdapterMap:
        taken = set(config.model_names.exact)  # pools and exact aliases
        pool_of: dict[str, str] = {}
        servers: dict[str, frozenset[str] | None] = {}
        roots: dict[str, dict[str, str | None]] = {}
        for model, pool in config.pools.items():
            named: dict[str, set[str] | None] = {}
            root: dict[str, str | None] = {}
            for replica_config in pool.replicas:
                for name in replica_config.adapters:
                    named.setdefault(name, set()).add(replica_config.replica_id)  # type: ignore[union-attr]
            route = routes.get(model)
            for replica in route.pool if route is not None else ():
                for name in replica.declared_adapters:  # a discovered pod's labels (static ones: above)
                    if name not in taken:
                        named.setdefault(name, set()).add(replica.replica_id)  # type: ignore[union-attr]
                for name, path in replica.adapters.items():
                    if name not in taken:
                        named.setdefault(name, set()).add(replica.replica_id)  # type: ignore[union-attr]
                        root.setdefault(name, path)
            named.update(dict.fromkeys(pool.adapters))  # declared for the pool: every replica
            for name, ids in named.items():
                if name in pool_of:
                    continue
                pool_of[name] = model
                servers[name] = None if ids is None else frozenset(ids)
                roots.setdefault(model, {})[name] = root.get(name)
        return cls(pool_of, servers, roots)

    def excluded(self, view: RequestView, route: ModelRoute, exclude: set[str]) -> set[str]:
        """`exclude`, plus the pool's replicas that do not serve the request's adapter (if it names one)."""
        if view.adapter is None:
            return exclude
        serving = self.servers.get(view.adapter, frozenset())  # gone since it was routed: none
        if serving is None:
            return exclude
        return exclude | {r.replica_id for r in route.pool if r.replica_id not in serving}


def named(view: RequestView, pool: str, adapters: AdapterMap) -> None:
    """`view` names `pool` by another name: an adapter keeps it in the body (`view.adapter`; metrics and
    keys take the pool's name), an alias, a pattern or the default pool is renamed to the pool's."""
    if adapters.pool_of.get(view.model) == pool:
        view.adapter, view.model = view.model, pool
    else:
        renamed(view, pool)
