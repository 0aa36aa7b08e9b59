"""Typed validation of plain YAML data into frozen dataclasses.

One small loader serves the config file and every policy's parameters, so each mistake gets
the same kind of error: the dotted key, what was expected, what was found, and the nearest name where
a name was mistyped. A load goes on past a mistake and reports every one it finds (`ConfigError.each`);
a section's own cross-field checks (`validate`) run once its fields are right.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin

from gateway.config.env import FromEnv
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
    errors: list[ConfigError] = []
    for name in data:
        if name not in fields:
            allowed = ", ".join(sorted(fields))
            errors.append(
                ConfigError(f"unknown key{near(str(name), fields)} (allowed: {allowed})", key=_join(key, str(name)))
            )
    values: dict[str, Any] = {}
    for name, field in fields.items():
        sub = _join(key, name)
        if name in data:
            try:
                values[name] = convert(hints[name], data[name], sub)
            except ConfigError as exc:
                errors.append(exc)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            errors.append(ConfigError("required key is missing", key=sub))
    if errors:
        raise ConfigError.of(errors)
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
            hint = near(value, [str(a) for a in allowed]) if isinstance(value, str) else ""
            raise ConfigError(f"must be one of {', '.join(map(repr, allowed))}, got {value!r}{hint}", key=key)
        return value
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(f"expected a list, got {_kind(value)}", key=key)
        (item_tp, *_) = get_args(tp) or (Any,)
        return tuple(_each(lambda i, item: convert(item_tp, item, f"{key}[{i}]"), list(enumerate(value))))
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"expected a mapping, got {_kind(value)}", key=key)
        k_tp, v_tp = get_args(tp) or (Any, Any)
        pairs = _each(lambda k, v: (convert(k_tp, k, key), convert(v_tp, v, _join(key, str(k)))), list(value.items()))
        return dict(pairs)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)  # type: ignore[arg-type]
    if isinstance(value, FromEnv) and tp in (bool, int, float):
        return _from_env(tp, value, key)
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


def near(name: str, known: typing.Iterable[str]) -> str:
    """ "; did you mean 'x'?" for the known name closest to a mistyped one (`pool` → `pools`), else ""."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    if not close and "-" in name:  # prefix-affinity → prefix_affinity
        close = difflib.get_close_matches(name.replace("-", "_"), list(known), n=1, cutoff=0.8)
    return f"; did you mean {close[0]!r}?" if close else ""


def _each(convert_one: typing.Callable[[Any, Any], T], items: list[tuple[Any, Any]]) -> list[T]:
    """`convert_one` over `items`, reporting every item's mistakes, not just the first one's."""
    out, errors = [], []
    for a, b in items:
        try:
            out.append(convert_one(a, b))
        except ConfigError as exc:
            errors.append(exc)
    if errors:
        raise ConfigError.of(errors)
    return out


_TRUE, _FALSE = frozenset({"true", "yes", "on", "1"}), frozenset({"false", "no", "off", "0"})


def _from_env(tp: type, value: FromEnv, key: str) -> Any:
    """A number or boolean written as `${VAR}`: the variable's text, read as the field's type."""
    text = value.strip()
    if tp is bool:
        if text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise ConfigError(f"expected true or false from the environment, got {text!r}", key=key)
    try:
        return int(text) if tp is int else float(text)
    except ValueError:
        kind = "an integer" if tp is int else "a number"
        raise ConfigError(f"expected {kind} from the environment, got {text!r}", key=key) from None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {value!r}"[:80]
