"""The configuration reference, made from the config's own classes: a JSON Schema (editors validate a
config file with it) and a Markdown page (docs/config-reference.md), so that neither can drift from what
the gateway loads. Each key's text is the comment beside its field, or its class's docstring.

    affinity-gateway config-reference            # the Markdown page
    affinity-gateway config-reference --json-schema
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import textwrap
import tokenize
import types
import typing
from typing import Any, Literal, get_args, get_origin

from gateway.config.loader import Config
from gateway.config.policy_params import POLICY_CONFIGS

_SCALARS = {bool: "boolean", int: "integer", float: "number", str: "string"}


def json_schema() -> dict[str, Any]:
    """Draft 2020-12 JSON Schema of a config file (variables as `${VAR}` strings are allowed everywhere)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Affinity Gateway config",
        **_schema(Config),
    }


def _schema(tp: Any) -> dict[str, Any]:
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_schema(option) for option in get_args(tp)]}
    if tp is type(None):
        return {"type": "null"}
    if origin is Literal:
        return {"enum": list(get_args(tp))}
    if origin in (list, tuple):
        return {"type": "array", "items": _schema(get_args(tp)[0])}
    if origin is dict or tp is dict:
        value = get_args(tp)[1] if get_args(tp) else Any
        return {"type": "object", "additionalProperties": _schema(value)}
    if dataclasses.is_dataclass(tp):
        hints, comments = typing.get_type_hints(tp), _comments(tp)
        properties = {}
        for field in dataclasses.fields(tp):
            prop = _schema(hints[field.name])
            if comments.get(field.name):
                prop["description"] = comments[field.name]
            properties[field.name] = prop
        out: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
        required = [f.name for f in dataclasses.fields(tp) if _default(f) is dataclasses.MISSING]
        if required:
            out["required"] = required
        doc = _doc(tp)
        return {**out, "description": doc} if doc else out
    if tp in _SCALARS:
        scalar = _SCALARS[tp]
        numeric = scalar in ("integer", "number", "boolean")  # `${VAR}` text is read as the field's type
        return {"anyOf": [{"type": scalar}, {"type": "string", "pattern": r"\$\{"}]} if numeric else {"type": scalar}
    return {}


def markdown() -> str:
    """The reference page: one table per section, by dotted key."""
    out = [
        "# Configuration reference",
        "",
        "Generated from the config's classes by `affinity-gateway config-reference`; do not edit by hand.",
        "`config.example.yaml` is the commented example, [Configuration](configuration.md) the guide. Every",
        "key is optional unless marked required; unknown keys are errors. `affinity-gateway config-reference",
        "--json-schema` prints the same as a JSON Schema, for editors.",
        "",
    ]
    _section(out, Config, "", "The file")
    for name, cls in POLICY_CONFIGS.items():
        _section(out, cls, f"pools.<model>.routing.params ({name})", f"Parameters of policy `{name}`")
    return "\n".join(out).rstrip() + "\n"


def _section(out: list[str], cls: Any, key: str, title: str) -> None:
    hints, comments = typing.get_type_hints(cls), _comments(cls)
    nested: list[tuple[Any, str]] = []
    out += [f"## {title}" if not key else f"## `{key}`", ""]
    if doc := _doc(cls):
        out += [doc.split("\n\n")[0].replace("\n", " "), ""]
    out += ["| key | type | default | what it is |", "|---|---|---|---|"]
    for field in dataclasses.fields(cls):
        tp, sub = hints[field.name], f"{key}.{field.name}" if key else field.name
        default = _default(field)
        shown = "required" if default is dataclasses.MISSING else _shown(default)
        what = comments.get(field.name) or _first_sentence(next((_doc(inner) for inner, _ in _inner(tp)), ""))
        out.append(f"| `{field.name}` | {_type_name(tp)} | {shown} | {_cell(what)} |")
        nested += [(inner, sub + suffix) for inner, suffix in _inner(tp)]
    out.append("")
    for inner, sub in nested:
        if inner is not cls:
            _section(out, inner, sub, sub)


def _inner(tp: Any) -> list[tuple[Any, str]]:
    """The sections inside a field's type, with how their key continues (`[]`, `.<name>`)."""
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return [(tp, "")]
    if origin in (typing.Union, types.UnionType):
        return [found for option in get_args(tp) for found in _inner(option)]
    if origin in (list, tuple):
        return [(inner, "[]" + rest) for inner, rest in _inner(get_args(tp)[0])]
    if origin is dict and get_args(tp):
        name = "<model>" if get_args(tp)[1] is not Any else "<name>"
        return [(inner, f".{name}" + rest) for inner, rest in _inner(get_args(tp)[1])]
    return []


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(option) for option in get_args(tp))
    if tp is type(None):
        return "none"
    if origin is Literal:
        return " \\| ".join(f"`{value}`" for value in get_args(tp))
    if origin in (list, tuple):
        return f"list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return "mapping" if not get_args(tp) or get_args(tp)[1] is Any else f"mapping of {_type_name(get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return "section"
    return _SCALARS.get(tp, "any")


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _shown(value: Any) -> str:
    if dataclasses.is_dataclass(value):
        return "see below"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (tuple, list)):
        return "`[]`" if not value else f"`{list(value)}`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    return f"`{value}`" if value != "" else '`""`'


def _doc(cls: Any) -> str:
    """A class's own docstring (not the one dataclasses writes from its signature)."""
    doc = inspect.getdoc(cls) or ""
    return "" if doc.startswith(cls.__name__ + "(") else doc


def _first_sentence(text: str) -> str:
    return text.split("\n\n")[0].replace("\n", " ").split(". ")[0].rstrip(".")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _comments(cls: Any) -> dict[str, str]:
    """Each field's trailing comment in the class's source (what the field is for, as the code says it)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    names = {f.name for f in dataclasses.fields(cls)}
    found: dict[str, str] = {}
    line_field: dict[int, str] = {}
    for number, line in enumerate(source.splitlines(), 1):
        head = line.strip().split(":", 1)[0]
        if line.startswith("    ") and not line.startswith("     ") and head in names:
            line_field[number] = head
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and token.start[0] in line_field:
            found[line_field[token.start[0]]] = token.string.lstrip("#").strip()
    return found
