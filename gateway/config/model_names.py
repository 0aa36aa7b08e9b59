"""Model names in the config: which pool a request's `model` names (the pool, an alias, a wildcard
pattern or the default pool), and the load-time checks that every name (pool, alias, adapter) names
one thing only.

    pools:
      smollm2:
        aliases: [gpt-4o-mini, "smol-*"]    # exact names, or fnmatch patterns (* ? [...])
        adapters: [sql-lora]                # LoRA adapters (gateway.routing.adapters)
    routes:
      default_pool: smollm2                # any other name goes here (unset: 404)

An exact name wins over a pattern, patterns are tried in pool order, the default comes last. How a
request is renamed to its pool's name is `gateway.routing.model_names`.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.errors import ConfigError

if TYPE_CHECKING:
    from gateway.config.pools import PoolConfig


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


def check_adapters(pools: Mapping[str, PoolConfig], exact: Sequence[str]) -> None:
    """Declared adapters are names no pool or exact alias has, each in one pool only. Errors name the key."""
    owner: dict[str, tuple[str | None, str]] = {name: (None, "a pool or an exact alias") for name in exact}
    for model, pool in pools.items():
        declared = [(f"pools.{model}.adapters[{i}]", name) for i, name in enumerate(pool.adapters)]
        declared += [
            (f"pools.{model}.replicas[{j}].adapters[{i}]", name)
            for j, replica in enumerate(pool.replicas)
            for i, name in enumerate(replica.adapters)
        ]
        for key, name in declared:
            if not isinstance(name, str) or not name.strip():
                raise ConfigError("an adapter is a non-empty model name (vLLM's --lora-modules NAME=path)", key=key)
            pool_name, what = owner.setdefault(name, (model, f"an adapter of pool {model!r}"))
            if pool_name != model:
                raise ConfigError(f"{name!r} already names {what}", key=key)


__all__ = ["ModelNames", "check_adapters", "check_names", "exact_aliases"]
