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
(`gateway.routing.adapters`: vLLM selects the adapter by it).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

from gateway.errors import ConfigError
from gateway.view import RequestView

_PATTERN = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class ModelNames:
    exact: dict[str, str]  # pool name or exact alias -> pool
    patterns: tuple[tuple[re.Pattern[str], str], ...]  # compiled wildcard -> pool, in pool order
    default: str | None

    @classmethod
    def of(cls, aliases: Mapping[str, Sequence[str]], default: str | None) -> ModelNames:
        """`aliases`: each pool's aliases (validated by `check_names`)."""
        exact = {pool: pool for pool in aliases}
        patterns = []
        for pool, names in aliases.items():
            for name in names:
                if _PATTERN.search(name):
                    patterns.append((re.compile(fnmatch.translate(name)), pool))
                else:
                    exact[name] = pool
        return cls(exact, tuple(patterns), default)

    def pool_for(self, model: str) -> str | None:
        pool = self.exact.get(model)
        if pool is not None:
            return pool
        return next((p for pattern, p in self.patterns if pattern.match(model)), self.default)


def check_names(aliases: Mapping[str, Sequence[str]], default: str | None, key: str) -> None:
    """An exact alias names one pool only; a default names a pool. Errors name the key."""
    owner = {pool: f"pool {pool!r}" for pool in aliases}
    for pool, names in aliases.items():
        for i, name in enumerate(names):
            where = f"pools.{pool}.aliases[{i}]"
            if not isinstance(name, str) or not name.strip():
                raise ConfigError("an alias is a non-empty model name or pattern", key=where)
            if _PATTERN.search(name):
                continue
            if name in owner:
                raise ConfigError(f"{name!r} already names {owner[name]}", key=where)
            owner[name] = f"an alias of pool {pool!r}"
    if default is not None and default not in aliases:
        raise ConfigError(f"no pool named {default!r} (pools: {', '.join(aliases)})", key=f"{key}.default_pool")


def exact_aliases(names: Sequence[str]) -> list[str]:
    """The aliases that are names, not patterns (what `/v1/models` can list)."""
    return [name for name in names if not _PATTERN.search(name)]


def renamed(view: RequestView, pool: str) -> None:
    """Send the request on under its pool's name: one re-encode, only for a request that used another name."""
    view.body["model"] = view.model = pool
    view.raw = orjson.dumps(view.body)
