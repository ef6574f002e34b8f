"""The import graph of skewd has no circles, and data flows one way.

A circle between modules means neither can be read, tested or moved without the other; a
function-level import that closes one only hides it (the cycle still runs, later). So this reads
every ``import`` statement of every skewd module with ``ast`` (module level, inside functions and
under ``TYPE_CHECKING`` alike) and fails on any strongly connected group of modules, naming each
edge by file and line. It also holds the layering the architecture promises
(lab → agent/controller/rules → model): nothing a deployed node or controller runs imports the
fault lab, the rule language imports no collector, agent or transport, and the data model
imports nothing of skewd.
"""
from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import pytest

#: the packages installed under the skewd namespace (setup.py's LAYOUT) plus skewd itself
PACKAGES = ("skewd", "skewd.agent", "skewd.collectors", "skewd.rules", "skewd.controller", "skewd.lab")


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    #: imported skewd module → line numbers of the statements importing it
    imports: dict[str, list[int]] = field(default_factory=dict)


def _discover() -> dict[str, Module]:
    mods: dict[str, Module] = {}
    for pkg in PACKAGES:
        spec = importlib.util.find_spec(pkg)
        assert spec is not None and spec.submodule_search_locations, pkg
        root = Path(next(iter(spec.submodule_search_locations)))
        # skewd/'s sibling packages (agent, rules, ...) are mapped by setup.py, not nested in it;
        # what is nested in it (skewd/wire/) is skewd's own
        files = root.rglob("*.py")
        for p in files:
            parts = list(p.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            name = ".".join([pkg, *parts])
            mods[name] = Module(name, p, is_package)
    return mods


def _targets(mod: Module, node: ast.Import | ast.ImportFrom, mods: dict[str, Module]) -> set[str]:
    """The skewd modules one import statement loads (the deepest existing module of each name)."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = mod.name.split(".")
            if not mod.is_package:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            src = ".".join(base + ([node.module] if node.module else []))
        else:
            src = node.module or ""
        # ``from pkg import sub`` imports the submodule; ``from mod import name`` imports mod
        names = [f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src for a in node.names]
    out = set()
    for n in names:
        while n and n not in mods:
            n = n.rpartition(".")[0]
        if n and n != mod.name:
            out.add(n)
    return out


def import_graph() -> dict[str, Module]:
    mods = _discover()
    for m in mods.values():
        for node in ast.walk(ast.parse(m.path.read_text(), str(m.path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in _targets(m, node, mods):
                    m.imports.setdefault(t, []).append(node.lineno)
    return mods


def cycles(mods: dict[str, Module]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(mods):
        if root in index:
            continue
        work = [(root, iter(sorted(mods[root].imports)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(mods[w].imports))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, Module]:
    return import_graph()


def _where(m: Module, target: str) -> str:
    return f"{m.path}:{m.imports[target][0]}: {m.name} imports {target}"


def test_graph_sees_the_whole_package(graph: dict[str, Module]) -> None:
    # a walker that found nothing would pass every check below
    assert "skewd.rules.engine" in graph and "skewd.lab.sim.simulator" in graph
    assert "skewd.model" in graph["skewd.rules.engine"].imports
    assert sum(len(m.imports) for m in graph.values()) > 300


def test_cycle_detection_finds_a_function_level_cycle() -> None:
    a = Module("a", Path("a.py"), False, {"b": [3]})
    b = Module("b", Path("b.py"), False, {"c": [1]})
    c = Module("c", Path("c.py"), False, {"a": [40]})  # e.g. an import inside a function
    d = Module("d", Path("d.py"), False, {"a": [1]})
    assert cycles({m.name: m for m in (a, b, c, d)}) == [["a", "b", "c"]]


def test_no_import_cycles(graph: dict[str, Module]) -> None:
    lines = []
    for group in cycles(graph):
        members = set(group)
        lines.append("cycle: " + " ↔ ".join(group))
        lines += ["  " + _where(graph[a], b) for a in group for b in sorted(graph[a].imports) if b in members]
    assert not lines, "import cycles (move the shared piece into a module both can import):\n" + "\n".join(lines)


def _layer_violations(graph: dict[str, Module], importers: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    def within(name: str, prefixes: tuple[str, ...]) -> bool:
        return any(name == p or name.startswith(p + ".") for p in prefixes)

    return [_where(m, t) for m in graph.values() if within(m.name, importers)
            for t in sorted(m.imports) if within(t, forbidden)]


def test_deployed_code_never_imports_the_lab(graph: dict[str, Module]) -> None:
    # the lab drives agents and controllers; what a node or a controller runs knows nothing of it
    bad = _layer_violations(graph, ("skewd.agent", "skewd.controller", "skewd.rules", "skewd.collectors",
                                    "skewd.model", "skewd.wire"), ("skewd.lab",))
    assert not bad, "\n".join(bad)


def test_rules_know_nothing_of_collectors_agent_or_transport(graph: dict[str, Module]) -> None:
    bad = _layer_violations(graph, ("skewd.rules",), ("skewd.agent", "skewd.controller", "skewd.collectors",
                                                      "skewd.natsutil", "skewd.wire", "skewd.lab"))
    assert not bad, "\n".join(bad)


def test_collectors_know_nothing_downstream(graph: dict[str, Module]) -> None:
    bad = _layer_violations(graph, ("skewd.collectors",), ("skewd.agent", "skewd.controller", "skewd.rules",
                                                           "skewd.lab"))
    assert not bad, "\n".join(bad)


def test_the_data_model_is_the_bottom(graph: dict[str, Module]) -> None:
    assert not graph["skewd.model"].imports, graph["skewd.model"].imports
