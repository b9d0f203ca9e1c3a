"""docs/architecture.md stays true: every import in src/modperf respects its layer block."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers import REPO

SRC = REPO / "src" / "modperf"


def _layers() -> dict[str, int]:
    text = (REPO / "docs" / "architecture.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```layers block"
    layers: dict[str, int] = {}
    for line in block.group(1).strip().splitlines():
        level, names = line.split(":", 1)
        for name in names.split():
            layers[name] = int(level)
    return layers


def _unit(path: Path) -> str:
    """The top-level module or package of src/modperf a file belongs to."""
    rel = path.relative_to(SRC).parts
    return rel[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    """Top-level modperf units a file imports (relative or absolute, anywhere in the file)."""
    tree = ast.parse(path.read_text())
    depth = len(path.relative_to(SRC).parts) - 1  # 0 for modperf/x.py, 1 for modperf/pkg/x.py
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                up = node.level - 1
                if up > depth:
                    continue
                if up < depth:  # inside the file's own package
                    continue
                if node.module:
                    out.add(node.module.split(".")[0])
                else:
                    out.update(alias.name for alias in node.names)
            elif node.module and node.module.startswith("modperf."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("modperf."))
    return out


def test_every_module_is_in_the_layer_block() -> None:
    layers = _layers()
    units = {_unit(p) for p in SRC.rglob("*.py")} - {"__init__"}
    assert sorted(units - set(layers)) == [], "add these modules to docs/architecture.md"
    assert sorted(set(layers) - units) == [], "these modules in docs/architecture.md no longer exist"


def test_no_module_imports_a_higher_layer() -> None:
    layers = _layers()
    violations = []
    for path in sorted(SRC.rglob("*.py")):
        unit = _unit(path)
        if unit == "__init__":
            continue
        for target in _imports(path):
            if target in layers and layers[target] > layers[unit]:
                violations.append(f"{path.relative_to(SRC)} (layer {layers[unit]}) imports {target} "
                                  f"(layer {layers[target]})")
    assert violations == []
