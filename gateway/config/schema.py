"""Typed validation of plain YAML data into frozen dataclasses.

One small loader serves the config file and every policy's parameters, so each mistake gets
the same kind of error: the dotted key, what was expected, what was found.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin

from gateway.errors import ConfigError

T = TypeVar("T")


def build(cls: type[T], data: Any, key: str = "") -> T:
    """Validate `data` (a mapping from YAML) against dataclass `cls`; unknown keys are errors."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a mapping, got {_kind(data)}", key=key)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for name in data:
        if name not in fields:
            allowed = ", ".join(sorted(fields))
            raise ConfigError(f"unknown key (allowed: {allowed})", key=_join(key, str(name)))
    values: dict[str, Any] = {}
    for name, field in fields.items():
        sub = _join(key, name)
        if name in data:
            values[name] = convert(hints[name], data[name], sub)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError("required key is missing", key=sub)
    instance = cls(**values)
    check = getattr(instance, "validate", None)
    if check is not None:
        check(key)
    return instance


def convert(tp: Any, value: Any, key: str) -> Any:
    """Convert one YAML value to type `tp` or raise ConfigError naming `key`."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        if len(real := [o for o in options if o is not type(None)]) == 1:
            return convert(real[0], value, key)  # X | None: keep the nested key in the error
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return convert(option, value, key)
            except ConfigError as exc:
                errors.append(exc.reason)
        raise ConfigError("; ".join(errors), key=key)
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise ConfigError(f"must be one of {', '.join(map(repr, allowed))}, got {value!r}", key=key)
        return value
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(f"expected a list, got {_kind(value)}", key=key)
        (item_tp, *_) = get_args(tp) or (Any,)
        return tuple(convert(item_tp, item, f"{key}[{i}]") for i, item in enumerate(value))
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"expected a mapping, got {_kind(value)}", key=key)
        k_tp, v_tp = get_args(tp) or (Any, Any)
        return {convert(k_tp, k, key): convert(v_tp, v, _join(key, str(k))) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)  # type: ignore[arg-type]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"expected true or false, got {_kind(value)}", key=key)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"expected an integer, got {_kind(value)}", key=key)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"expected a number, got {_kind(value)}", key=key)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"expected a string, got {_kind(value)}", key=key)
        return value
    raise TypeError(f"schema: unsupported type {tp!r} at {key}")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {value!r}"[:80]
