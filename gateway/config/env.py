"""`${VAR}` in config values, and the resolved config as `affinity-gateway check` prints it.

Secrets (a Redis password, a token) stay out of the YAML: `url: redis://:${REDIS_PASSWORD}@redis:6379/0`.
`${VAR:-default}` gives a default; `$${` is a literal `${`. A variable that is neither set nor
defaulted is a config error naming the key, like every other config mistake. Interpolation
applies to values only (never to keys), before the schema checks types; a value with a variable in it
is a `FromEnv` string, which a number or boolean field reads as one (`port: ${PORT:-8000}`).

`resolved` masks every value that came from a variable, URL passwords, and values under
secret-sounding keys, so the printed config can be pasted into an issue.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel

from gateway.errors import ConfigError

_VAR = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_UNCLOSED = re.compile(r"(?<!\$)\$\{")
_SECRET_KEY = re.compile(r"password|secret|token|api_key$", re.IGNORECASE)
MASK = "***"
Path = tuple[str | int, ...]


class FromEnv(str):
    """A value written with `${VAR}`: the environment can only give text, so the schema reads it as the
    number or boolean its field wants."""

    __slots__ = ()


def interpolate(data: Any, env: Mapping[str, str], key: str = "") -> Any:
    """`data` with `${VAR}` replaced in every string value; ConfigError naming the key of a missing one."""
    if isinstance(data, str):
        return _substitute(data, env, key)
    if isinstance(data, list):
        return [interpolate(item, env, f"{key}[{i}]") for i, item in enumerate(data)]
    if isinstance(data, dict):
        return {k: interpolate(v, env, f"{key}.{k}" if key else str(k)) for k, v in data.items()}
    return data


def _substitute(text: str, env: Mapping[str, str], key: str) -> str:
    if "${" not in text:
        return text

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        name, default = match.group(1), match.group(2)
        value = env.get(name)
        if value is None:
            if default is None:
                raise ConfigError(
                    f"environment variable {name!r} is not set (write ${{{name}:-default}} for a default)", key=key
                )
            return default
        return value

    if _UNCLOSED.search(_VAR.sub("", text)):
        raise ConfigError(f"unterminated or malformed ${{...}} in {text[:40]!r}", key=key)
    substituted = _VAR.sub(one, text)
    return FromEnv(substituted) if _VAR.search(text.replace("$${", "")) else substituted


KEY_PREFIX = "AFFINITY_GATEWAY__"


def with_key_overrides(data: Any, env: Mapping[str, str]) -> Any:
    """The file's data with `AFFINITY_GATEWAY__<SECTION>__<KEY>=value` variables set over it: any key, one
    `__` per level, names lower-cased, as pydantic-settings nests them (`AFFINITY_GATEWAY__LIMITS__MAX_BODY_BYTES=
    1048576`, `AFFINITY_GATEWAY__POOLS__LLAMA__ROUTING__POLICY=round_robin`). A value is read as its key's
    type, like a `${VAR}` (`FromEnv`); the schema checks it as it checks the file, and names a key that is
    not one with the nearest name. pydantic-settings is not used for this one rule: the config would have to
    become its settings class, take the YAML as a custom source, and read its variables' text in a lax mode
    the strict sections refuse."""
    overrides = sorted((name, value) for name, value in env.items() if name.startswith(KEY_PREFIX))
    if not overrides:
        return data
    data = copy.deepcopy(data) if isinstance(data, dict) else {}
    for name, value in overrides:
        path = [part.lower() for part in name[len(KEY_PREFIX) :].split("__")]
        if not all(path):
            raise ConfigError("expected AFFINITY_GATEWAY__SECTION__KEY, one `__` per level", key=f"env {name}")
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"`{part}` holds a value, not keys", key=f"env {name}")
            node = child
        node[path[-1]] = FromEnv(value)
    return data


def interpolated_paths(data: Any, path: Path = ()) -> set[Path]:
    """The paths (as in the parsed YAML) of string values that name a variable."""
    if isinstance(data, str):
        return {path} if _VAR.search(data.replace("$${", "")) else set()
    items = enumerate(data) if isinstance(data, list) else data.items() if isinstance(data, dict) else ()
    return set().union(*(interpolated_paths(v, (*path, k)) for k, v in items))


def resolved(config: Any, secret_paths: set[Path] = frozenset()) -> Any:  # type: ignore[assignment]
    """The config as plain data, every default filled in and every secret masked."""
    return _masked(_plain(config), secret_paths, ())


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return {name: _plain(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _masked(value: Any, secret_paths: set[Path], path: Path) -> Any:
    if path in secret_paths and value not in (None, ""):
        return MASK
    if isinstance(value, dict):
        return {
            k: MASK if _SECRET_KEY.search(k) and isinstance(v, str) and v else _masked(v, secret_paths, (*path, k))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_masked(v, secret_paths, (*path, i)) for i, v in enumerate(value)]
    if isinstance(value, str) and "://" in value:
        return mask_url_password(value)
    return value


def mask_url_password(url: str) -> str:
    """The URL with its password (if any) replaced by the mask: for logs and printed configs."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not password:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}"))
