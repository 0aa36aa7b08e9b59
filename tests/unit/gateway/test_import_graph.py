"""The import graph's rules (issue 32), read from the source by `tests.import_graph`: every import counts,
lazy and TYPE_CHECKING ones too, since each is a dependency a reader must follow."""

from __future__ import annotations

import ast

from tests.helpers import ROOT
from tests.import_graph import cycles, eager_graph, graph, module_files, package_graph

MAX_TOP_LEVEL = 8  # errors, log, the request view, __main__, __init__ and a few more: the rest live in rooms


def test_no_module_imports_itself_through_a_circle() -> None:
    found = cycles(graph(ROOT, ["gateway", "lab"]))
    assert not found, "import circles between modules: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_module_is_loaded_half_way_through_a_circle() -> None:
    # Eager imports plus the packages they load first: a package __init__ importing its modules, and one of
    # those reaching back through a sibling, fails with "partially initialized module" in one import order.
    found = cycles(eager_graph(ROOT, ["gateway", "lab"]))
    assert not found, "circles when modules load (packages' __init__ included): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_config_imports_nothing_of_the_gateway_but_errors() -> None:
    edges = graph(ROOT, ["gateway"])
    outside = {
        name: sorted(t for t in targets if not t.startswith("gateway.config") and t != "gateway.errors")
        for name, targets in edges.items()
        if name.startswith("gateway.config")
    }
    outside = {name: targets for name, targets in outside.items() if targets}
    assert not outside, f"gateway.config must import only gateway.errors and itself (features import config): {outside}"


def test_no_package_imports_itself_through_a_circle() -> None:
    # Rooms, sub-packages included (routing and routing.policies are two): each may import only what lies
    # below it, so the folder tree reads as layers.
    found = cycles(package_graph(ROOT, ["gateway"]))
    assert not found, "import circles between packages: " + "; ".join(" <-> ".join(c) for c in found)


def test_only_the_cli_imports_the_lab_or_the_replica_stub() -> None:
    edges = graph(ROOT, ["gateway", "lab", "replica_stub"])
    wrong = {
        name: sorted(t for t in targets if t.split(".")[0] in ("lab", "replica_stub"))
        for name, targets in edges.items()
        if name.startswith("gateway") and not name.startswith("gateway.cli")
    }
    wrong = {name: targets for name, targets in wrong.items() if targets}
    assert not wrong, f"the product imports the lab or the replica stub (only gateway.cli may): {wrong}"


def test_the_gateway_package_keeps_few_top_level_modules() -> None:
    top = sorted(path.name for path in (ROOT / "gateway").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, f"gateway/ has {len(top)} top-level modules, at most {MAX_TOP_LEVEL}: {top}"


def test_every_package_says_what_it_holds() -> None:
    packages = [path for path in module_files(ROOT, ["gateway"]).values() if path.name == "__init__.py"]
    silent = [
        str(path.relative_to(ROOT)) for path in packages if ast.get_docstring(ast.parse(path.read_text())) is None
    ]
    assert not silent, f"packages without a docstring in __init__.py: {silent}"
