"""The database: a data root, its model configs, its keyed tables (loaded on first use) and the
query engine over them."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import cache as keyed_cache
from . import scan_cache
from .buckets import KeyedTable
from .catalog import Catalog, TableRef
from .families import family_of
from .loader import TableStore
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
                 model_configs: Iterable[str | os.PathLike[str]] | None = None, *, cache: bool | None = None) -> None:
        if keyed_cache.enabled(cache):  # the scan of an earlier process, while the data root is unchanged
            self.catalog = scan_cache.scan(data_root)
        else:
            self.catalog = Catalog.scan(data_root)
        self.models = ModelRegistry.default(model_configs)
        #: ``cache``: keyed tables from the persisted cache (modperf.cache); None: on unless
        #: MODPERF_NO_CACHE is set.
        self.store = TableStore(self.catalog, self.models, cache=cache)
        self._query_engine: QueryEngine | None = None

    @property
    def root(self) -> Path:
        return self.catalog.root

    def ref(self, system: str, backend: str, version: str, table: str) -> TableRef:
        return self.store.ref(system, backend, version, table)

    def load(self, ref: TableRef) -> KeyedTable:
        return self.store.load(ref)

    def table(self, system: str, backend: str, version: str, table: str) -> KeyedTable:
        return self.store.table(system, backend, version, table)

    def tables(self, *, system: str | None = None, backend: str | None = None, version: str | None = None,
               table: str | None = None) -> Iterator[KeyedTable]:
        """Every declared slot matching the filters (reuse-resolved), loaded."""
        for ref in self.catalog.select(system=system, backend=backend, version=version, table=table,
                                       physical=False):
            if family_of(ref.table) is not None:
                yield self.load(ref)

    # -- queries (semantics in modperf.query and docs/queries.md) ----------------------------

    @property
    def queries(self) -> QueryEngine:
        if self._query_engine is None:
            from .query import QueryEngine

            self._query_engine = QueryEngine(self.store, self.models)
        return self._query_engine

    def query(self, /, **fields: Any) -> Answer:
        """One latency: ``db.query(table=..., system=..., backend=..., version=..., model=... |
        native_heads=..., tp_size=... | num_heads=..., <key columns>..., allow_substitute=False)``.
        Every field is a keyword (``self`` positional-only), so no field name collides with a
        Python name: an unknown one is a QueryFieldError like any other."""
        return self.queries.query(fields)

    def answer(self, fields: Mapping[str, Any], *, quality: bool = True, diagnose: bool = True) -> Answer:
        """``query`` with the fields as a mapping; ``quality=False`` skips the quality notes
        (model-level estimates, which make many queries, list them per table instead);
        ``diagnose=False`` refuses a point outside the grid without naming the nearest measured
        points (cheap: for callers trying several kernels)."""
        return self.queries.query(fields, quality=quality, diagnose=diagnose)

    def query_many(self, /, **fields: Any) -> Latencies:
        """Vectorised: numpy arrays for the numeric axes (batch_size, isl, step, num_tokens, and
        num_heads where it is the heads axis) of one table group, scalars for everything else.
        Returns latencies (NaN where refused) and kind codes (0 exact, 1 interpolated,
        2 extrapolated, -1 refused); unpacks as ``latency_ms, kinds``."""
        return self.queries.query_many(fields)


def open(data_root: str | os.PathLike[str] | None = None,  # noqa: A001  (modperf.open, by design)
         model_configs: Iterable[str | os.PathLike[str]] | None = None, *, cache: bool | None = None) -> Database:
    """The database of a data root (the embedded corpus by default); ``cache=False`` keys every
    table from its file instead of the persisted cache (modperf.cache)."""
    return Database(data_root, model_configs, cache=cache)
