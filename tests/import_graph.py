"""The gateway's import graph, read from the source with `ast`: every import counts, those under
`if TYPE_CHECKING:` and inside functions too, since each is a dependency a reader must follow."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of the given top-level packages, by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: Mapping[str, Path]) -> set[str]:
    """The known modules `name` imports: `from a.b import c` is a.b.c when that is a module, else a.b."""
    return _resolve(name, path, ast.walk(ast.parse(path.read_text(), str(path))), known)


def _resolve(name: str, path: Path, nodes: Iterable[ast.AST], known: Mapping[str, Path]) -> set[str]:
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in known else base)
    resolved: set[str] = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            resolved.add(target)
    return resolved


def _eager_nodes(body: list[ast.stmt]) -> Iterable[ast.AST]:
    """The import statements run when the module loads: at top level, in top-level `try`/`if` blocks,
    not under `if TYPE_CHECKING:` and not in functions or classes."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                yield from _eager_nodes(node.body)
            yield from _eager_nodes(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _eager_nodes(block)


def eager_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """What loading each module loads at once: its eager imports, and for each, the packages above it
    (importing a.b.c runs a/b/__init__.py first), but not the module's own parents (already loading).
    A circle here is an ImportError of a partly initialised module, whichever module is imported first."""
    known = module_files(root, packages)
    result: dict[str, set[str]] = {}
    for name, path in known.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        tree = ast.parse(path.read_text(), str(path))
        targets = _resolve(name, path, _eager_nodes(tree.body), known)
        above = {".".join(t.split(".")[:i]) for t in targets for i in range(1, t.count(".") + 1)}
        result[name] = (targets | {p for p in above if p in known}) - own - {name}
    return result


def graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    known = module_files(root, packages)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted: the import circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in edges:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def package_of(module: str, is_package: bool) -> str:
    """A module's package: itself for a package, its parent for a module."""
    return module if is_package else module.rpartition(".")[0]


def package_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """Imports between packages (a package's modules, not its sub-packages): a → b when a module of a
    imports a module of b; a sub-package is a package of its own. `__main__`, the entry point that
    imports the CLI, does not count."""
    known = module_files(root, packages)
    edges = graph(root, packages)
    result: dict[str, set[str]] = {}
    for name, targets in edges.items():
        if name.endswith(".__main__"):
            continue
        source = package_of(name, known[name].name == "__init__.py")
        out = result.setdefault(source, set())
        for target in targets:
            dest = package_of(target, known[target].name == "__init__.py")
            if dest and dest != source:
                out.add(dest)
    return result
