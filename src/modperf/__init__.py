"""modperf: the performance database for LLM-inference attention modules.

Every module row carries rank-local ``num_heads`` and ``tp_size``; each table family declares
how its head axis is keyed; native head counts come from HF configs; loaders fail closed.

    db = modperf.open()                       # the embedded corpus (or open(data_root=...))
    db.query(table=..., system=..., ...)      # one latency with its provenance
    modperf.check()                           # every declared table, every guard

The heavier tools live in their modules, imported on use: ``modperf.estimate.estimate``,
``modperf.migrate.migrate``, ``modperf.writer.open_writer``, ``modperf.dedupe.dedupe``,
``modperf.coverage.coverage``, ``modperf.quality.assess``, ``modperf.layers.layer_schedule``.
"""

from __future__ import annotations

from . import errors
from ._meta import __version__
from .buckets import KeyedTable
from .catalog import Catalog, TableRef
from .check import CheckReport, check
from .db import Database, open  # noqa: A004  (modperf.open shadows the builtin by design)
from .errors import ModperfError
from .families import Family, Tier, family_of, registry
from .loader import Loaded, Scope, load_one, load_table
from .models import ModelConfig, ModelRegistry

__all__ = [
    "Catalog", "CheckReport", "Database", "Family", "KeyedTable", "Loaded", "ModelConfig", "ModelRegistry",
    "ModperfError", "Scope", "TableRef", "Tier", "__version__", "check", "errors", "family_of", "load_one",
    "load_table", "open",
    "registry",
]
