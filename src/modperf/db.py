"""The database: a data root, its model configs, and keyed tables loaded on first use."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import errors as E
from .buckets import KeyedTable
from .catalog import Catalog, TableRef
from .families import family_of
from .load import load_table
from .models import ModelRegistry

if TYPE_CHECKING:
    from .query import Answer, Latencies, QueryEngine


class Database:
    """Tables of one data root, keyed by the head-axis convention, loaded lazily and cached.

    ``table(system, backend, version, table)`` answers from the slot's own file or, where the
    version folder's ``reuse.yaml`` declares it, from the donor version (``ref.reuse`` says so).
    Loading is strict: a table with any failure raises TableRejectedError.
    """

    def __init__(self, data_root: str | os.PathLike[str] | None = None,
                 model_configs: Iterable[str | os.PathLike[str]] | None = None) -> None:
        self.catalog = Catalog.scan(data_root)
        self.models = ModelRegistry.default(model_configs)
        self._tables: dict[Path, KeyedTable] = {}
        self._lock = threading.Lock()
        self._query_engine: QueryEngine | None = None

    @property
    def root(self) -> Path:
        return self.catalog.root

    def ref(self, system: str, backend: str, version: str, table: str) -> TableRef:
        ref = self.catalog.slot(system, backend, version, table)
        if ref is None:
            have = sorted({(r.system, r.backend, r.version) for r in self.catalog.slots if r.table == table})
            raise E.UnknownTableError(
                f"no {table} table for system={system} backend={backend} version={version}",
                values={"table": table, "system": system, "backend": backend, "version": version},
                fix=("available: " + ", ".join(f"{s}/{b}/{v}" for s, b, v in have[:12])
                     + (" ..." if len(have) > 12 else "")) if have else
                    f"{table} exists nowhere under {self.root}; see `modperf ls`",
            )
        return ref

    def load(self, ref: TableRef) -> KeyedTable:
        if family_of(ref.table) is None:
            raise E.UnknownTableError(f"{ref.table!r} is not a head-bearing table", file=ref.path,
                                      fix="see `modperf ls` for the head-bearing tables")
        with self._lock:
            cached = self._tables.get(ref.path)
        if cached is not None:
            return cached if cached.ref == ref else _with_ref(cached, ref)
        keyed = load_table(ref, self.models)
        with self._lock:
            self._tables[ref.path] = keyed
        return keyed

    def table(self, system: str, backend: str, version: str, table: str) -> KeyedTable:
        return self.load(self.ref(system, backend, version, table))

    def tables(self, *, system: str | None = None, backend: str | None = None, version: str | None = None,
               table: str | None = None) -> Iterator[KeyedTable]:
        """Every head-bearing slot matching the filters (reuse-resolved), loaded."""
        for ref in self.catalog.select(system=system, backend=backend, version=version, table=table,
                                       physical=False):
            family = family_of(ref.table)
            if family is not None and family.head_bearing:
                yield self.load(ref)

    # -- queries (semantics in modperf.query and docs/queries.md) ----------------------------

    @property
    def queries(self) -> QueryEngine:
        if self._query_engine is None:
            from .query import QueryEngine

            self._query_engine = QueryEngine(self)
        return self._query_engine

    def query(self, **fields: Any) -> Answer:
        """One latency: ``db.query(table=..., system=..., backend=..., version=..., model=... |
        native_heads=..., tp_size=... | num_heads=..., <key columns>..., allow_substitute=False)``."""
        return self.queries.query(fields)

    def query_many(self, **fields: Any) -> Latencies:
        """Vectorised: numpy arrays for the numeric axes (batch_size, isl, step, num_tokens, and
        num_heads where it is the heads axis) of one table group, scalars for everything else.
        Returns latencies (NaN where refused) and kind codes (0 exact, 1 interpolated,
        2 extrapolated, -1 refused); unpacks as ``latency_ms, kinds``."""
        return self.queries.query_many(fields)


def _with_ref(keyed: KeyedTable, ref: TableRef) -> KeyedTable:
    """The same loaded data seen through another slot (a reuse declaration): share the arrays,
    change only the provenance."""
    import copy

    view = copy.copy(keyed)
    view.ref = ref
    return view


def open(data_root: str | os.PathLike[str] | None = None,  # noqa: A001  (modperf.open, by design)
         model_configs: Iterable[str | os.PathLike[str]] | None = None) -> Database:
    return Database(data_root, model_configs)
