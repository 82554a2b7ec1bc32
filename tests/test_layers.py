"""The import layers of the repository, checked from the source (`ast`, function-local and
``TYPE_CHECKING`` imports included, nothing imported).

Fails on (a) an import cycle between modules and (b) an import that runs back up a layer:

- ``swarm`` never imports ``a3r``, ``memory`` or ``templates``; ``memory`` imports none of the others;
  ``templates`` imports only ``swarm.client``; ``a3r`` imports only ``swarm.client`` (its public
  modules), ``memory`` and ``templates`` from outside itself.
- Within ``a3r`` and ``swarm`` the layers below (`A3R_LAYERS`, `SWARM_LAYERS`): a unit imports only
  itself and units of lower layers; units of one layer are peers and do not import each other.

The rules are data; the tests at the end plant violations in synthetic module graphs and files to
show the checker reports them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("swarm", "a3r", "memory", "templates")

Layers = tuple[tuple[str, ...], ...]

A3R_LAYERS: Layers = (
    ("a3r",),  # the package's face (version only)
    ("a3r.app",),  # cli, commands, session, tui
    ("a3r.graph",),  # state, run context, nodes, builder
    ("a3r.providers", "a3r.swarmops"),  # LLM providers | swarm processes, execution, monitoring, evaluation
    ("a3r.study",),  # plans, run types, analysis, research, patches, report
    ("a3r.errors",),
)
"""a3r's layers, top first (derived from the folders)."""

SWARM_LAYERS: Layers = (
    ("swarm", "swarm.cli"),
    ("swarm.server",),
    ("swarm.run_options",),  # swarm run's flags; builds the RunnerConfig (imports the client when called)
    ("swarm.client",),  # the HTTP client and runner: never imports the server
    ("swarm.serve_options",),  # swarm serve's flags; builds the ServerConfig (imports it when called)
    ("swarm.engine.factory",),  # builds the engine a ServerConfig names: above the config it reads
    ("swarm.config",),
    ("swarm.engine", "swarm.pool", "swarm.batch"),
    ("swarm.protocol",),
    ("swarm.train",),  # losses and trainers; owns the step metrics the protocol re-exports
    ("swarm.tracking",),
    ("swarm.errors", "swarm.heap", "swarm.precision"),
)
"""swarm's layers, top first (derived from today's imports: the server composes engine, trainer,
tracking and pool; the client speaks the wire protocol only)."""

LAYERS: Mapping[str, Layers] = {"a3r": A3R_LAYERS, "swarm": SWARM_LAYERS}

OUTSIDE: Mapping[str, tuple[str, ...]] = {
    "a3r": ("swarm.client", "memory", "templates"),
    "swarm": (),
    "memory": (),
    "templates": ("swarm.client",),
}
"""What each package may import from the other three (module prefixes). Below ``swarm.client`` only its
public modules (no ``_`` in the path) count."""


@dataclass(frozen=True, order=True)
class Edge:
    """``importer`` imports ``imported`` at ``line`` (module names; ``imported`` may be a package)."""

    importer: str
    imported: str
    line: int


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Module name → file, for every ``.py`` file of ``packages`` under ``root``."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            found[module_name(path, root)] = path
    return found


def imports_of(name: str, path: Path, modules: Iterable[str], packages: Iterable[str]) -> list[Edge]:
    """Every import of ``packages`` by module ``name`` (file ``path``), wherever it stands in the file.

    ``from X import Y`` is an import of ``X.Y`` when that is a module, else of ``X``; when ``X`` is a
    package it is also an import of ``X`` itself (its ``__init__`` runs first: a package-face import,
    ``from swarm.server import limits``, runs whatever the package's face imports). Relative imports are
    resolved against ``name``.
    """
    known = set(modules)
    faces = {m.rsplit(".", 1)[0] for m in known if "." in m} & known  # packages (an __init__ in the tree)
    roots = tuple(packages)
    is_package = path.name == "__init__.py"
    edges: list[Edge] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names]
            if source in faces and source != name:
                targets.append(source)  # a package's face: its __init__ runs before any of its names
        for target in targets:
            if target.split(".")[0] in roots:
                edges.append(Edge(name, target, node.lineno))
    return sorted(set(edges))


def import_graph(root: Path, packages: Iterable[str] = PACKAGES) -> list[Edge]:
    """The import edges of every module of ``packages`` under ``root``."""
    files = source_files(root, packages)
    return [edge for name, path in files.items() for edge in imports_of(name, path, files, packages)]


def cycles(edges: Iterable[Edge]) -> list[frozenset[str]]:
    """The import cycles: strongly connected components of more than one module, and self-imports
    (Tarjan's algorithm, iterative)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.importer, set()).add(e.imported)
        graph.setdefault(e.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(frozenset(component))
    return found


def _unit(module: str, layers: Layers) -> tuple[int, str] | None:
    """(layer index, unit) of ``module``: the longest unit prefix that names it (a package's root unit,
    e.g. ``a3r``, names only its ``__init__``)."""
    best: tuple[int, str] | None = None
    for depth, units in enumerate(layers):
        for unit in units:
            below = "." in unit and module.startswith(unit + ".")
            if (module == unit or below) and (best is None or len(unit) > len(best[1])):
                best = (depth, unit)
    return best


def _public_below(module: str, prefix: str) -> bool:
    """``module`` is ``prefix`` or a public module below it (no part starting with ``_``)."""
    if module == prefix:
        return True
    if not module.startswith(prefix + "."):
        return False
    return not any(part.startswith("_") for part in module[len(prefix) + 1 :].split("."))


def violations(
    edges: Iterable[Edge],
    *,
    layers: Mapping[str, Layers] = LAYERS,
    outside: Mapping[str, tuple[str, ...]] = OUTSIDE,
) -> list[str]:
    """Every import that runs back up a layer, crosses to a peer, or leaves its package other than
    through `OUTSIDE`, as one line each (``file:line importer -> imported: rule``)."""
    found: list[str] = []
    reported: set[tuple[str, int, str]] = set()
    for e in edges:
        src_pkg, dst_pkg = e.importer.split(".")[0], e.imported.split(".")[0]
        where = f"{e.importer}:{e.line} {e.importer} -> {e.imported}"
        if src_pkg != dst_pkg:
            ok = any(_public_below(e.imported, p) for p in outside.get(src_pkg, ()))
            if not ok:
                found.append(f"{where}: {src_pkg} may import only {outside.get(src_pkg, ())} from outside")
            continue
        package_layers = layers.get(src_pkg)
        if package_layers is None:
            continue
        src, dst = _unit(e.importer, package_layers), _unit(e.imported, package_layers)
        if src is None or dst is None:
            missing = e.importer if src is None else e.imported
            found.append(f"{where}: {missing} is in no layer (add it to the layers)")
            continue
        if src[1] == dst[1] or (e.importer, e.line, dst[1]) in reported:
            continue  # one line per import statement and unit (``from P import m``: P's face and P.m)
        reported.add((e.importer, e.line, dst[1]))
        if dst[0] < src[0]:
            found.append(f"{where}: runs back up from layer {src[1]} to {dst[1]}")
        elif dst[0] == src[0]:
            found.append(f"{where}: {src[1]} and {dst[1]} are peers")
    return found


# ------------------------------------------------------------------------------------------ the tree


@pytest.fixture(scope="module")
def tree() -> list[Edge]:
    return import_graph(ROOT)


def test_every_module_is_read(tree: list[Edge]) -> None:
    modules = {e.importer for e in tree}
    assert {"a3r.app.cli", "a3r.graph.builder", "a3r.swarmops.execution", "swarm.server.app"} <= modules


def test_no_import_cycles(tree: list[Edge]) -> None:
    found = [sorted(c) for c in cycles(tree)]
    assert not found, f"import cycles: {found}"


def test_no_import_runs_back_up_a_layer(tree: list[Edge]) -> None:
    found = violations(tree)
    assert not found, "\n".join(found)


# ------------------------------------------------------------------------------------------ planted


def _edges(*pairs: str) -> list[Edge]:
    return [Edge(*pair.split(" -> "), line=1) for pair in pairs]


def test_a_planted_back_import_is_reported() -> None:
    edges = _edges(
        "a3r.graph.runner -> a3r.swarmops.execution",
        "a3r.swarmops.execution -> a3r.graph.context",  # runs back up
    )
    found = violations(edges)
    assert len(found) == 1 and "runs back up from layer a3r.swarmops to a3r.graph" in found[0]


def test_a_planted_peer_import_is_reported() -> None:
    found = violations(_edges("a3r.providers.chat -> a3r.swarmops.processes"))
    assert len(found) == 1 and "peers" in found[0]


@pytest.mark.parametrize(
    ("pair", "reported"),
    [
        ("swarm.server.runtime -> a3r.graph", True),
        ("swarm.client._client -> memory", True),
        ("a3r.study.plans -> swarm.server.app", True),
        ("a3r.swarmops.evaluate -> swarm.client._runner", True),  # private below swarm.client
        ("a3r.app.cli -> swarm.cli", True),  # the old exceptions: no a3r module may import these
        ("a3r.app.commands -> swarm.engine.model_loading", True),
        ("a3r.app.commands -> swarm.errors", True),
        ("a3r.app.cli -> swarm.client.console_script", False),  # public below swarm.client
        ("memory._store -> templates", True),
        ("templates.math.workflow -> swarm.client.workflow", False),
        ("a3r.swarmops.evaluate -> swarm.client", False),
        ("a3r.graph.coder -> templates", False),
    ],
)
def test_imports_across_packages(pair: str, reported: bool) -> None:
    assert bool(violations(_edges(pair))) is reported


def test_swarm_rules() -> None:
    assert violations(_edges("swarm.engine.hf -> swarm.server.runtime"))  # engine below server
    assert violations(_edges("swarm.client._client -> swarm.server.app"))  # client never imports server
    assert violations(_edges("swarm.train.trainer -> swarm.engine.hf"))  # peers
    assert not violations(
        _edges("swarm.server.training -> swarm.train", "swarm.server.runtime -> swarm.pool")
    )


def test_a_module_in_no_layer_is_reported() -> None:
    found = violations(_edges("a3r.app.cli -> a3r.helpers"))
    assert len(found) == 1 and "in no layer" in found[0]


def test_a_planted_cycle_is_reported() -> None:
    edges = _edges(
        "a3r.study.plans -> a3r.study.runs",
        "a3r.study.runs -> a3r.study.report",
        "a3r.study.report -> a3r.study.plans",
    )
    assert cycles(edges) == [frozenset({"a3r.study.plans", "a3r.study.runs", "a3r.study.report"})]
    assert cycles(_edges("a3r.errors -> a3r.errors")) == [frozenset({"a3r.errors"})]
    assert cycles(_edges("a3r.app.cli -> a3r.graph", "a3r.graph -> a3r.study.runs")) == []


def plant(root: Path, files: Mapping[str, str]) -> None:
    """Write ``files`` (relative path → text) under ``root``."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_a_planted_file_with_a_function_local_back_import(tmp_path: Path) -> None:
    """A real file tree: a lower layer imports a higher one inside a function (the lazy-import trick
    that hid the old back-imports) and through a relative import."""
    files = {
        "a3r/__init__.py": "",
        "a3r/graph/__init__.py": "from a3r.graph import nodes\n",
        "a3r/graph/nodes.py": "from a3r.study.runs import RunSpec\n",
        "a3r/study/__init__.py": "",
        "a3r/study/runs.py": (
            "class RunSpec: ...\n\n"
            "def late():\n"
            "    from a3r.graph.nodes import helper  # hidden in a function\n"
            "    from ..graph import nodes  # and relative\n"
        ),
    }
    plant(tmp_path, files)
    edges = import_graph(tmp_path, ("a3r",))
    assert Edge("a3r.study.runs", "a3r.graph.nodes", 4) in edges
    assert Edge("a3r.study.runs", "a3r.graph.nodes", 5) in edges
    found = violations(edges)
    assert len(found) == 2 and all("runs back up from layer a3r.study to a3r.graph" in f for f in found)
    # ``from ..graph import nodes`` runs the package face ``a3r.graph`` too, which imports ``nodes``
    assert cycles(edges) == [frozenset({"a3r.graph", "a3r.graph.nodes", "a3r.study.runs"})]


def test_a_planted_package_face_loop(tmp_path: Path) -> None:
    """``from swarm.server import fmt`` runs ``swarm/server/__init__`` first: when that face imports the
    app, which imports the importer, the loop is reported though every named module is a leaf."""
    files = {
        "swarm/__init__.py": "",
        "swarm/server/__init__.py": "from swarm.server.app import create_app\n",
        "swarm/server/app.py": "from swarm.server.limits import BodySizeLimit\n\ndef create_app(): ...\n",
        "swarm/server/limits.py": "from swarm.server import fmt\n\nclass BodySizeLimit: ...\n",
        "swarm/server/fmt.py": "",
    }
    plant(tmp_path, files)
    edges = import_graph(tmp_path, ("swarm",))
    assert Edge("swarm.server.limits", "swarm.server", 1) in edges
    assert Edge("swarm.server.limits", "swarm.server.fmt", 1) in edges
    assert cycles(edges) == [frozenset({"swarm.server", "swarm.server.app", "swarm.server.limits"})]
    (tmp_path / "swarm/server/__init__.py").write_text('"""A face that imports nothing."""\n')
    assert cycles(import_graph(tmp_path, ("swarm",))) == []


def test_no_route_module_sees_the_runtime(tree: list[Edge]) -> None:
    """Routes depend on one narrow service each (`swarm.server.deps`), never on the whole runtime: no
    route module imports it or reads it from the app's state."""
    routes = sorted((ROOT / "swarm" / "server").glob("*_routes.py"))
    assert len(routes) >= 4
    names = {module_name(path, ROOT) for path in routes}
    assert not [e for e in tree if e.importer in names and e.imported == "swarm.server.runtime"]
    for path in routes:
        assert "state.runtime" not in path.read_text(encoding="utf-8"), path.name
