"""Which pool a request's `model` names: the pool itself, one of its aliases, a wildcard pattern, or
the default pool.

    pools:
      smollm2:
        aliases: [gpt-4o-mini, "smol-*"]    # exact names, or fnmatch patterns (* ? [...])
    routes:
      default_pool: smollm2                # any other name goes here (unset: 404)

An exact name wins over a pattern, patterns are tried in pool order, the default comes last. A
request routed by another name reaches its replicas under the pool's name (the body's `model` is
rewritten: the pool's name is the one vLLM serves), and metrics and logs carry the pool's name, so
names a client makes up never become label values. A LoRA adapter's name is not renamed
(`gateway.routing.adapters`: vLLM selects the adapter by it). The names are read and checked with the
config (`gateway.config.model_names`: `ModelNames`, `Config.model_names`); this module renames.
"""

from __future__ import annotations

import orjson

from gateway.view import RequestView


def renamed(view: RequestView, pool: str) -> None:
    """Send the request on under its pool's name: one re-encode, only for a request that used another name."""
    view.body["model"] = view.model = pool
    view.raw = orjson.dumps(view.body)
