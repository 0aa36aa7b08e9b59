"""The base of every config section and policy's parameters (`Section`, a pydantic model), and `build`,
which validates YAML data against one and reports every mistake as a `ConfigError` naming its dotted key.

pydantic checks the types, collects every mistake of a load (not just the first) and gives the JSON
Schema (`gateway.config.reference`); what is ours is the config's words for a mistake: the dotted key
(`pools.m.replicas[0].url`), what was expected and what was found, and the nearest name where a key or
a choice was mistyped (`pool` → `pools`). A section's cross-field checks (`check`) run once its fields
are right.
"""

from __future__ import annotations

import difflib
import functools
import types
import typing
from collections.abc import Iterable
from typing import Any, Self, TypeVar, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from gateway.config.env import FromEnv
from gateway.config.field_docs import describe
from gateway.errors import ConfigError, join_key

S = TypeVar("S", bound="Section")


class Section(BaseModel):
    """Frozen: one config is shared by every request and replaced whole on reload, never changed in place.
    Unknown keys are mistakes, and types are strict (`port: "80"` is an error, not a guess), except
    where YAML cannot say it otherwise: a list is read as the tuple a section holds, and a `${VAR}`'s
    text as the number or boolean its field wants (`port: ${PORT:-8000}`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, json_schema_extra=describe)

    @model_validator(mode="before")
    @classmethod
    def _nothing_is_defaults(cls, data: Any) -> Any:
        """`listen:` with nothing under it is the section with every default."""
        return {} if data is None else data

    @field_validator("*", mode="wrap")
    @classmethod
    def _as_yaml_says_it(cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        if isinstance(value, FromEnv):
            value = _from_env(_field_type(cls, info.field_name), value)
        elif isinstance(value, list) and get_origin(_field_type(cls, info.field_name)) is tuple:
            value = tuple(value)
        return handler(value)

    @model_validator(mode="after")
    def _checked(self) -> Self:
        self.check()
        return self

    def check(self) -> None:
        """Cross-field checks, once every field is right. A ConfigError's key is relative to the section
        (`port`, `replicas[1]`); the load puts the section's own key in front."""


def build(cls: type[S], data: Any, key: str = "") -> S:
    """`data` (YAML's plain values) validated as `cls`; every mistake in one ConfigError, keys under `key`."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc, cls).under(key) from None


def changed(section: S, changes: dict[str, Any], origin: dict[str, str], key: str) -> S:
    """`section` (the file's `key`) with `changes` made from outside the file (the environment), validated as
    the file's values are; a mistake in a changed field names where its value came from (`origin`)."""
    if not changes:
        return section
    try:
        return build(type(section), {**dict(section), **changes})
    except ConfigError as exc:
        mistakes = [ConfigError(one.reason, key=origin.get(one.key) or join_key(key, one.key)) for one in exc.each]
        raise ConfigError.of(mistakes) from None


def _config_error(exc: ValidationError, root: type[BaseModel]) -> ConfigError:
    """pydantic's errors in the config's words, in the order found, each naming its dotted key."""
    found = []
    for error in exc.errors(include_url=False):
        key = _dotted(error["loc"])
        cause = error.get("ctx", {}).get("error")
        if isinstance(cause, ConfigError):  # a section's check, or a variable that is no number
            found.append(cause.under(key))
        else:
            found.append(ConfigError(_reason(error, root), key=key))
    return ConfigError.of(found)


def near(name: str, known: Iterable[str]) -> str:
    """ "; did you mean 'x'?" for the known name closest to a mistyped one (`pool` → `pools`), else ""."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    if not close and "-" in name:  # prefix-affinity → prefix_affinity
        close = difflib.get_close_matches(name.replace("-", "_"), list(known), n=1, cutoff=0.8)
    return f"; did you mean {close[0]!r}?" if close else ""


_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
}


def _reason(error: ErrorDetails, root: type[BaseModel]) -> str:
    kind, loc, value = error["type"], error["loc"], error["input"]
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        owner = _type_at(root, loc[:-1])
        allowed = sorted(owner.model_fields) if _is_section(owner) else []
        return f"unknown key{near(str(loc[-1]), allowed)} (allowed: {', '.join(allowed)})"
    if kind == "literal_error":
        choices = get_args(_type_at(root, loc))
        hint = near(value, [str(c) for c in choices]) if isinstance(value, str) else ""
        return f"must be one of {', '.join(map(repr, choices))}, got {value!r}{hint}"
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {_kind(value)}"
    return error["msg"]


def _dotted(loc: tuple[int | str, ...]) -> str:
    key = ""
    for part in loc:
        key = join_key(key, f"[{part}]" if isinstance(part, int) else str(part))
    return key


def _type_at(tp: Any, loc: tuple[int | str, ...]) -> Any:
    """The type at `loc` inside `tp` (a section), following fields, list items and mapping values."""
    for part in loc:
        tp = _unoptional(tp)
        if _is_section(tp):
            field = tp.model_fields.get(str(part))
            tp = field.annotation if field is not None else None
        elif get_origin(tp) in (tuple, list, dict):
            tp = get_args(tp)[-1 if get_origin(tp) is dict else 0]
        else:
            return None
    return _unoptional(tp)


@functools.cache
def _field_type(cls: type[BaseModel], name: str | None) -> Any:
    field = cls.model_fields.get(name or "")
    return _unoptional(field.annotation) if field is not None else None


def _unoptional(tp: Any) -> Any:
    """`X` of `X | None`."""
    if get_origin(tp) in (typing.Union, types.UnionType):
        real = [option for option in get_args(tp) if option is not type(None)]
        return real[0] if len(real) == 1 else tp
    return tp


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


_TRUE, _FALSE = frozenset({"true", "yes", "on", "1"}), frozenset({"false", "no", "off", "0"})


def _from_env(tp: Any, value: FromEnv) -> Any:
    """A value written as `${VAR}`: the variable's text, read as the field's number or boolean; a field of
    any other type takes the text as it is."""
    text = value.strip()
    if tp is bool:
        if text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise ConfigError(f"expected true or false from the environment, got {text!r}")
    if tp in (int, float):
        try:
            return int(text) if tp is int else float(text)
        except ValueError:
            kind = "an integer" if tp is int else "a number"
            raise ConfigError(f"expected {kind} from the environment, got {text!r}") from None
    return str(value)


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {value!r}"[:80]


__all__ = ["Section", "build", "changed", "near"]
