"""A config file's YAML, read with its aliases bounded.

An alias (`*name`) repeats its anchor's whole value, so a 1 KB file of nested aliases can stand for 10**8
values: PyYAML builds that document cheaply (every alias the same Python object), but `${VAR}`
interpolation and validation walk every repetition (37 s and 2.39 GB for one such file, on load and on
reload). So the document's size as it will be walked, counting every repetition, is computed on the
composed node graph (each distinct node once, linear in the file) and refused over `MAX_VALUES` before
anything is constructed. An alias of a value that contains itself can never be walked to its end: refused
too (PyYAML builds it; interpolation met it as a RecursionError).
"""

from __future__ import annotations

from typing import Any

import yaml

from gateway.errors import ConfigError

# Values (scalars, lists, mappings, keys included) the expanded document may hold. The example config holds
# about 600; one with thousands of replicas listed, tens of thousands.
MAX_VALUES = 1_000_000


def load_yaml(text: str, most: int = MAX_VALUES) -> Any:
    """The document in `text` (None when empty); ConfigError when its aliases expand it past `most` values
    or make it contain itself. yaml.YAMLError as `yaml.safe_load` raises it."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded(node, {}, most)
        if size > most:
            raise ConfigError(
                f"YAML aliases expand this document to more than {most:,} values (at least {size:,}); "
                "repeat less through anchors (&name / *name)"
            )
        return loader.construct_document(node)  # type: ignore[no-untyped-call]
    finally:
        loader.dispose()  # type: ignore[no-untyped-call]


_IN_PROGRESS = -1


def _expanded(node: yaml.Node, sizes: dict[int, int], most: int) -> int:
    """How many values `node` stands for once every alias is repeated; stops counting past `most`."""
    known = sizes.get(id(node))
    if known == _IN_PROGRESS:
        raise ConfigError("a YAML alias refers to a value that contains it: the document has no end")
    if known is not None:
        return known
    sizes[id(node)] = _IN_PROGRESS
    total = 1
    if isinstance(node, yaml.SequenceNode):
        children: list[yaml.Node] = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    else:
        children = []
    for child in children:
        total += _expanded(child, sizes, most)
        if total > most:
            break
    sizes[id(node)] = total
    return total
