"""The tree shows the architecture, and stays so.

Every stage of ``src/modperf`` (a package, or for now a top-level module) says in its docstring
what it may import, on a line ``May import: ...`` (the standard library always; the third-party
packages and the modperf stages it names). docs/architecture.md orders the stages in its
```stages block. These tests read both and hold every import in ``src/modperf`` to them, counting
imports inside functions and under ``TYPE_CHECKING``:

* a stage imports only the stages its rule names, each of them an earlier stage;
* a stage imports no third-party package its rule does not name (the fast path and the base
  name none: the standard library only);
* no import cycle between modules;
* no private name (``_x``) of another module is imported or reached as an attribute.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from tests.helpers import REPO

SRC = REPO / "src" / "modperf"
#: Files of the package root: the package's own entry points, not a stage.
ROOT_FILES = {"__init__", "__main__"}


def _stages() -> list[list[str]]:
    text = (REPO / "docs" / "architecture.md").read_text()
    block = re.search(r"```stages\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```stages block"
    return [line.split(":", 1)[1].split() for line in block.group(1).strip().splitlines()]


def _order() -> dict[str, int]:
    return {unit: i for i, units in enumerate(_stages()) for unit in units}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["modperf", *parts])


def _unit(module: str) -> str:
    """The stage a module belongs to: its top-level package or module under modperf."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in SRC.rglob("*.py")}


def _unit_docstring(unit: str) -> str:
    path = SRC / unit / "__init__.py" if (SRC / unit).is_dir() else SRC / f"{unit}.py"
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def _rule(unit: str) -> tuple[set[str], set[str]]:
    """(third-party packages, modperf stages) the unit's ``May import:`` line names."""
    doc = _unit_docstring(unit)
    found = re.search(r"May import:(.*?)(?:\.\s*$|\.\n|\Z)", doc, re.S | re.M)
    assert found, f"modperf.{unit}'s docstring has no 'May import: ...' line"
    third: set[str] = set()
    stages: set[str] = set()
    for item in re.split(r"[,;]", found.group(1).replace("\n", " ")):
        item = item.strip().rstrip(".")
        if not item or item == "the standard library" or item.startswith("the standard library"):
            continue
        if item.startswith("modperf."):
            stages.add(item.removeprefix("modperf."))
        else:
            third.add(item)
    return third, stages


class _Imports:
    """Every import of one file: modperf modules (resolved), third-party top-level names, the
    private names taken from other modules."""

    def __init__(self, module: str, path: Path) -> None:
        self.module = module
        self.modules: set[str] = set()
        self.third_party: set[str] = set()
        self.private: list[str] = []
        #: modperf paths imported that are no module of the tree (an old path, modperf.MOVED)
        self.stale: list[str] = []
        mods = _modules()
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text())
        bound: dict[str, str] = {}  # local name -> modperf module it names
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    top = alias.name.split(".")[0]
                    if top == "modperf":
                        if alias.name not in mods:
                            self.stale.append(alias.name)
                        self._add(alias.name, mods)
                        if alias.asname:
                            bound[alias.asname] = alias.name
                    elif top not in sys.stdlib_module_names:
                        self.third_party.add(top)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = package.split(".")
                    base_parts = base_parts[:len(base_parts) - node.level + 1]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                elif node.module and node.module.split(".")[0] == "modperf":
                    base = node.module
                else:
                    top = (node.module or "").split(".")[0]
                    if top and top not in sys.stdlib_module_names and top != "__future__":
                        self.third_party.add(top)
                    continue
                if base not in mods:
                    self.stale.append(base)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if base == "modperf" and alias.name in _moved():
                        self.stale.append(full)
                    if full in mods:
                        self._add(full, mods)
                        bound[alias.asname or alias.name] = full
                    else:
                        self._add(base, mods)
                        if alias.name.startswith("_") and not alias.name.startswith("__") and base != module:
                            self.private.append(f"from {base} import {alias.name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and node.attr.startswith("_") and not node.attr.startswith("__")
                    and bound[node.value.id] != module):
                self.private.append(f"{bound[node.value.id]}.{node.attr}")

    def _add(self, name: str, mods: dict[str, Path]) -> None:
        # a package's submodule or the module itself; never the file's own ancestors
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in mods and name != self.module and not self.module.startswith(name + "."):
            self.modules.add(name)


@cache
def _moved() -> dict[str, str]:
    import modperf

    return modperf.MOVED


@cache
def _graph() -> dict[str, _Imports]:
    return {m: _Imports(m, p) for m, p in _modules().items()}


def test_every_stage_is_ordered_and_declares_its_imports() -> None:
    order = _order()
    units = {_unit(m) for m in _modules()} - ROOT_FILES
    assert sorted(units - set(order)) == [], "add these stages to docs/architecture.md's ```stages block"
    assert sorted(set(order) - units - ROOT_FILES) == [], "these stages in docs/architecture.md no longer exist"
    for unit in sorted(units):
        _, stages = _rule(unit)
        later = sorted(s for s in stages if s not in order or order[s] >= order[unit])
        assert later == [], f"modperf.{unit} may import only earlier stages; its rule names {later}"


def test_every_import_follows_its_stage_rule() -> None:
    violations = []
    for module, found in sorted(_graph().items()):
        unit = _unit(module)
        if unit in ROOT_FILES:
            continue
        third, stages = _rule(unit)
        for target in sorted(found.modules):
            other = _unit(target)
            if other != unit and other not in stages and other not in ROOT_FILES:
                violations.append(f"{module} imports {target} (modperf.{unit} may import {sorted(stages)})")
        for name in sorted(found.third_party - third):
            violations.append(f"{module} imports {name} (modperf.{unit} may import {sorted(third) or 'no'} "
                              "third-party packages)")
    assert violations == []


def test_no_import_cycle() -> None:
    graph = {m: found.modules for m, found in _graph().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == []


def test_every_import_names_a_module_at_its_home() -> None:
    """Old module paths still import for one release (modperf.MOVED), but never from src."""
    found = [f"{m}: {p}" for m, imports in sorted(_graph().items()) for p in imports.stale]
    assert found == []


def test_no_private_name_crosses_modules() -> None:
    found = [f"{m}: {p}" for m, imports in sorted(_graph().items()) for p in imports.private]
    assert found == []


@pytest.mark.parametrize("source, problem", [
    ("import numpy\n", "numpy"),
    ("def f():\n    from ..data import loader\n", "modperf.data.loader"),
    ("from ..base.atomic import _temp_prefix\n", "_temp_prefix"),
])
def test_the_checks_catch_what_they_are_for(tmp_path: Path, source: str, problem: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A fast-path module importing numpy, reaching the data stage (lazily), or taking another
    module's private name is caught."""
    module = "modperf.fast.lattice"
    path = tmp_path / "lattice.py"
    path.write_text(source)
    found = _Imports(module, path)
    third, stages = _rule("fast")
    problems = ({f"{t}" for t in found.third_party - third}
                | {t for t in found.modules if _unit(t) not in stages | {"fast"}}
                | {p.rsplit(" ", 1)[-1].rsplit(".", 1)[-1] for p in found.private})
    assert problem in problems


#: The functions a lower stage is handed and calls (the only calls a question's way makes into
#: a later stage): (caller stage, the callee's module or package).
HANDED_DOWN = {
    ("base", "fast.persist"): "the persisted file's writer, which base.atomic runs into its temporary file",
    ("base", "data.keyed_cache"): "the same, for a keyed table's cache entry",
    ("data", "model.tables"): "the version policy's `answers` predicate (does a version's table answer?)",
    ("fast", "specs.roofline"): "the lattice's roofline, which holds utilisation past the measured points",
    ("specs", "data.families"): "a family's work function, which the roofline evaluates",
}


def _upward_calls(tmp_path: Path, args: list[str]) -> list[tuple[str, str, str, str]]:
    """Every call into a later stage that ``modperf ARGS`` makes, cold (tests/trace_calls.py)."""
    env = {**os.environ, "MODPERF_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "80",
           "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "trace_calls.py"), *args], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return [tuple(call) for call in json.loads(proc.stderr.strip().splitlines()[-1])]


def test_a_cold_query_never_calls_back_up(tmp_path: Path) -> None:
    """docs/architecture.md, "A cold single query": cli -> fast -> query -> specs / data -> fast
    -> base, each call into an earlier stage; the only later-stage function run is the writer
    base.atomic is handed for the persisted files."""
    calls = _upward_calls(tmp_path, ["query", "mla_context_module", "--system", "h200_sxm", "--backend", "trtllm",
                                     "--version", "1.3.0rc20", "--model", "deepseek-ai/DeepSeek-V3", "--tp", "8",
                                     "--batch-size", "4", "--isl", "2048", "--json"])
    assert calls == [("base", "fast", "fast.persist", "copy")]


def test_a_predict_calls_up_only_through_functions_handed_down(tmp_path: Path) -> None:
    """docs/architecture.md, "A predict": the calls into a later stage are the functions listed
    in HANDED_DOWN, never an import of a later stage."""
    calls = _upward_calls(tmp_path, ["predict", "--model", "Qwen/Qwen3-32B", "--system", "h200_sxm", "--backend",
                                     "vllm", "--tp", "2", "--isl", "1024", "--osl", "128", "--batch", "8", "--json"])
    assert calls, "the tracer saw nothing: it would pass anything"
    unexpected = [c for c in calls if not any(c[0] == stage and (c[2] == home or c[2].startswith(home + "."))
                                              for stage, home in HANDED_DOWN)]
    assert unexpected == []
    assert {(c[0], c[2].split(".")[0] + "." + c[2].split(".")[1]) for c in calls} >= {("fast", "specs.roofline")}
