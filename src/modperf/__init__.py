"""modperf: the performance database for LLM-inference modules.

Every module row carries rank-local ``num_heads`` and ``tp_size``; each table family declares
how its head axis is keyed; native head counts come from HF configs; loaders fail closed.

    db = modperf.open()                       # the embedded corpus (or open(data_root=...))
    db.query(table=..., system=..., ...)      # one latency with its provenance
    modperf.check()                           # every declared table, every guard
    db.table(...).to_arrow()                  # a table's measured points (to_frame(): pandas / polars)
    modperf.answers_to_arrow(answers)         # query answers, one row each
    modperf.export(db, "rows.parquet", system=...)   # what `modperf export` writes

The heavier tools live in their modules, imported on use: ``modperf.estimate.estimate``,
``modperf.migrate.migrate``, ``modperf.writer.open_writer``, ``modperf.dedupe.dedupe``,
``modperf.coverage.coverage``, ``modperf.quality.assess``, ``modperf.layers.layer_schedule``.

Every name below is imported on first use (PEP 562): a process that answers from the persisted
plans (:mod:`modperf.plans`) never imports numpy, pyarrow or the loading pipeline.
"""

from __future__ import annotations

import sys
import types

from ._meta import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:  # (typing costs a cold process ~5 ms: annotations only)
    from typing import Any

    from . import errors
    from .buckets import KeyedTable
    from .catalog import Catalog, TableRef
    from .check import CheckReport, check
    from .db import Database, open  # noqa: A004  (modperf.open shadows the builtin by design)
    from .errors import ModperfError
    from .export import export
    from .families import Family, Tier, family_of, registry
    from .frames import answers_to_arrow, to_frame
    from .lattice import KINDS
    from .loader import Loaded, Scope, load_one, load_table
    from .models import ModelConfig, ModelRegistry

#: Each public name -> the module that defines it.
_HOMES = {
    "KeyedTable": "buckets", "Catalog": "catalog", "TableRef": "catalog", "CheckReport": "check",
    "check": "check", "Database": "db", "open": "db", "Family": "families", "Tier": "families",
    "family_of": "families", "registry": "families", "Loaded": "loader", "Scope": "loader",
    "load_one": "loader", "load_table": "loader", "ModelConfig": "models", "ModelRegistry": "models",
    "ModperfError": "errors", "KINDS": "lattice", "answers_to_arrow": "frames", "to_frame": "frames",
    "export": "export",
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


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """The package's module type: ``modperf.check`` (and ``modperf.export``) stays the function.

    Importing a submodule binds it on its package under its name; the submodule
    ``modperf.check`` would then replace the function ``modperf.check`` (the package imported it
    eagerly before, and rebound the name after). Bound now on first use, the function is bound in
    the submodule's place instead."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("check", "export") and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
