"""What each config key is for, as the code says it: the comment beside its field, and its section's
docstring. The JSON Schema's descriptions (`describe`) and the reference page (`gateway.config.reference`)
both read them here, so the comments stay the one place a key is explained.
"""

from __future__ import annotations

import inspect
import io
import textwrap
import tokenize
from functools import cache
from typing import Any


@cache
def field_comments(cls: type) -> dict[str, str]:
    """Each field's trailing comment in the source of `cls` and of the classes it extends (its own win)."""
    found: dict[str, str] = {}
    for owner in reversed(cls.__mro__):
        if "__annotations__" in vars(owner) and not owner.__module__.startswith("pydantic"):
            found.update(_own_comments(owner))
    return found


def class_doc(cls: type) -> str:
    """The class's own docstring (not one inherited from the class it extends)."""
    doc = vars(cls).get("__doc__")
    return inspect.cleandoc(doc) if doc else ""


def describe(schema: dict[str, Any], cls: type) -> None:
    """pydantic's `json_schema_extra`: each property's description is its field's comment."""
    properties = schema.get("properties", {})
    for name, text in field_comments(cls).items():
        if name in properties:
            properties[name]["description"] = text


def _own_comments(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    names = set(vars(cls)["__annotations__"])
    line_field: dict[int, str] = {}
    for number, line in enumerate(source.splitlines(), 1):
        head = line.strip().split(":", 1)[0]
        if line.startswith("    ") and not line.startswith("     ") and head in names:
            line_field[number] = head
    found: dict[str, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and token.start[0] in line_field:
            found[line_field[token.start[0]]] = token.string.lstrip("#").strip()
    return found
