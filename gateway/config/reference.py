"""The configuration reference, made from the config's models: a JSON Schema (pydantic's own, for editors
and the Helm chart's values.schema.json) and a Markdown page (docs/config-reference.md), so that neither
can drift from what the gateway loads. Each key's text is the comment beside its field, or its section's
docstring (`gateway.config.field_docs`).

    affinity-gateway config-reference            # the Markdown page
    affinity-gateway config-reference --json-schema
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from gateway.config.field_docs import class_doc, field_comments
from gateway.config.loader import Config
from gateway.config.policy_params import POLICY_CONFIGS

_SCALARS = {bool: "boolean", int: "integer", float: "number", str: "string"}
_VARIABLE = {"type": "string", "pattern": r"\$\{"}  # `${VAR}`: its text is read as the field's type


class _ConfigSchema(GenerateJsonSchema):
    """pydantic's JSON Schema, where a number or a boolean may also be written as a `${VAR}`."""

    def int_schema(self, schema: core_schema.IntSchema) -> JsonSchemaValue:
        return {"anyOf": [super().int_schema(schema), _VARIABLE]}

    def float_schema(self, schema: core_schema.FloatSchema) -> JsonSchemaValue:
        return {"anyOf": [super().float_schema(schema), _VARIABLE]}

    def bool_schema(self, schema: core_schema.BoolSchema) -> JsonSchemaValue:
        return {"anyOf": [super().bool_schema(schema), _VARIABLE]}


def json_schema() -> dict[str, Any]:
    """Draft 2020-12 JSON Schema of a config file, every section written out in place (no `$ref`), so a
    part of it can be embedded elsewhere (the chart's values schema) and still stand on its own."""
    schema = Config.model_json_schema(schema_generator=_ConfigSchema)
    inlined = _inlined(schema, schema.pop("$defs", {}))
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "Affinity Gateway config", **inlined}


def _inlined(node: Any, defs: dict[str, Any]) -> Any:
    """`node` with each `$ref` replaced by its definition (the referring key's own words win) and without
    the titles pydantic makes from class and field names."""
    if isinstance(node, list):
        return [_inlined(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
    return {k: _inlined(v, defs) for k, v in node.items() if not (k == "title" and isinstance(v, str))}


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


def _section(out: list[str], cls: type[BaseModel], key: str, title: str) -> None:
    comments = field_comments(cls)
    nested: list[tuple[type[BaseModel], str]] = []
    out += [f"## {title}" if not key else f"## `{key}`", ""]
    if doc := class_doc(cls):
        out += [doc.split("\n\n")[0].replace("\n", " "), ""]
    out += ["| key | type | default | what it is |", "|---|---|---|---|"]
    for name, field in cls.model_fields.items():
        tp, sub = field.annotation, f"{key}.{name}" if key else name
        shown = "required" if field.is_required() else _shown(field.get_default(call_default_factory=True))
        what = comments.get(name) or _first_sentence(next((class_doc(inner) for inner, _ in _inner(tp)), ""))
        out.append(f"| `{name}` | {_type_name(tp)} | {shown} | {_cell(what)} |")
        nested += [(inner, sub + suffix) for inner, suffix in _inner(tp)]
    out.append("")
    for inner, sub in nested:
        if inner is not cls:
            _section(out, inner, sub, sub)


def _is_model(tp: Any) -> typing.TypeGuard[type[BaseModel]]:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _inner(tp: Any) -> list[tuple[type[BaseModel], str]]:
    """The sections inside a field's type, with how their key continues (`[]`, `.<name>`)."""
    origin = get_origin(tp)
    if _is_model(tp):
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
    if _is_model(tp):
        return "section"
    return _SCALARS.get(tp, "any")


def _shown(value: Any) -> str:
    if isinstance(value, BaseModel):
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


def _first_sentence(text: str) -> str:
    return text.split("\n\n")[0].replace("\n", " ").split(". ")[0].rstrip(".")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
