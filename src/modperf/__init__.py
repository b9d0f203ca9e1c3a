"""modperf: the performance database for LLM-inference modules.

Every module row carries rank-local ``num_heads`` and ``tp_size``; each table family declares
how its head axis is keyed; native head counts come from HF configs; loaders fail closed.

    db = modperf.open()                       # the embedded corpus (or open(data_root=...))
    db.query(table=..., system=..., ...)      # one latency with its provenance
    modperf.check()                           # every declared table, every guard
    db.table(...).to_arrow()                  # a table's measured points (to_frame(): pandas / polars)
    modperf.answers_to_arrow(answers)         # query answers, one row each
    modperf.export(db, "rows.parquet", system=...)   # what `modperf export` writes

The heavier tools live in their modules, imported on use: ``modperf.model.estimate.estimate``,
``modperf.audit.migrate.migrate``, ``modperf.audit.writer.open_writer``, ``modperf.audit.dedupe.dedupe``,
``modperf.audit.coverage.coverage``, ``modperf.data.quality.assess``, ``modperf.specs.layers.layer_schedule``.

Every name below is imported on first use (PEP 562): a process that answers from the persisted
plans (:mod:`modperf.fast.plans`) never imports numpy, pyarrow or the loading pipeline.
"""

from __future__ import annotations

import sys
import types

from .base.meta import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:  # (typing costs a cold process ~5 ms: annotations only)
    from typing import Any

    from .audit.check import CheckReport, check
    from .audit.export import export
    from .base import errors
    from .base.errors import ModperfError
    from .data.buckets import KeyedTable
    from .data.catalog import Catalog, TableRef
    from .data.families import Family, Tier, family_of, registry
    from .data.frames import answers_to_arrow, to_frame
    from .data.loader import Loaded, Scope, load_one, load_table
    from .fast.lattice import KINDS
    from .query.db import Database, open  # noqa: A004  (modperf.open shadows the builtin by design)
    from .specs.models import ModelConfig, ModelRegistry

#: Each public name -> the module that defines it.
_HOMES = {
    "KeyedTable": "data.buckets", "Catalog": "data.catalog", "TableRef": "data.catalog",
    "CheckReport": "audit.check", "check": "audit.check", "Database": "query.db", "open": "query.db",
    "Family": "data.families", "Tier": "data.families", "family_of": "data.families", "registry": "data.families",
    "Loaded": "data.loader", "Scope": "data.loader", "load_one": "data.loader", "load_table": "data.loader",
    "ModelConfig": "specs.models", "ModelRegistry": "specs.models", "ModperfError": "base.errors",
    "KINDS": "fast.lattice", "answers_to_arrow": "data.frames", "to_frame": "data.frames", "export": "audit.export",
}

#: Module paths of the flat layout before the stage packages (0.1) -> their homes now. Importing
#: an old path gives the module at its new home (one module object under both names), so that
#: code written against 0.1 keeps working for one release; ``modperf.errors`` stays for good
#: (the public error module). docs/architecture.md, "Old import paths".
MOVED = {
    "errors": "base.errors", "limits": "base.limits", "jsonio": "base.jsonio", "_meta": "base.meta",
    "atomic": "base.atomic",
    "cache_keys": "fast.cache_keys", "lattice": "fast.lattice", "answer": "fast.answer", "plans": "fast.plans",
    "batch": "fast.batch",
    "models": "specs.models", "roofline": "specs.roofline", "layers": "specs.layers",
    "reader": "data.reader", "catalog": "data.catalog", "schema": "data.schema", "codes": "data.codes",
    "versions": "data.versions", "families": "data.families", "conventions": "data.conventions",
    "validate": "data.validate", "buckets": "data.buckets", "keyed_guards": "data.keyed_guards",
    "cache": "data.keyed_cache", "scan_cache": "data.scan_cache", "loader": "data.loader",
    "quality": "data.quality", "inventory": "data.inventory",
    "interp": "query.interp", "deployment": "query.deployment", "resolve": "query.resolve",
    "query_lines": "query.lines", "db": "query.db",
    "check": "audit.check", "coverage": "audit.coverage", "dedupe": "audit.dedupe", "migrate": "audit.migrate",
    "writer": "audit.writer", "plot": "audit.plot",
    "estimate": "model.estimate", "model_step": "model.step",
    "predict": "serving.predict", "silicon": "serving.silicon",
}

__all__ = [
    "KINDS", "Catalog", "CheckReport", "Database", "Family", "KeyedTable", "Loaded", "ModelConfig", "ModelRegistry",
    "ModperfError", "Scope", "TableRef", "Tier", "__version__", "answers_to_arrow", "check", "errors", "export",
    "family_of", "load_one", "load_table", "open", "registry", "to_frame",
]


def __getattr__(name: str) -> Any:
    import importlib

    if name == "errors":  # the submodule (an import binds it here from then on)
        return importlib.import_module(".errors", __name__)
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'modperf' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


class _MovedModules:
    """Finds ``modperf.<old path>`` (and its submodules) as the module at its new home
    (:data:`MOVED`). A meta-path finder without importlib.abc, which a cold process would pay for."""

    prefix = __name__ + "."

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(self.prefix):
            return None
        head, dot, rest = fullname[len(self.prefix):].partition(".")
        home = MOVED.get(head)
        if home is None:
            return None
        spec_type: Any = type(sys.modules[__name__].__spec__)  # importlib's ModuleSpec, without importing importlib
        return spec_type(fullname, self, origin=f"{self.prefix}{home}{dot}{rest}")

    @staticmethod
    def create_module(spec: Any) -> Any:
        import importlib

        module = importlib.import_module(spec.origin)
        spec.home_spec = module.__spec__  # the import system sets the alias's spec on it next
        return module

    @staticmethod
    def exec_module(module: Any) -> None:
        module.__spec__ = module.__spec__.home_spec  # it ran at its home: keep its own spec


sys.meta_path.insert(0, _MovedModules())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """The package's module type: ``modperf.check`` stays the function.

    Importing a module binds it on its package under its name: importing the old path
    ``modperf.check`` (:data:`MOVED`) would bind the module :mod:`modperf.audit.check` over the
    function ``modperf.check``; the function is bound in its place instead."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "check" and isinstance(value, types.ModuleType):
            value = value.check
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
