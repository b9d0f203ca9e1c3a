"""The database: a data root, its model configs, its keyed tables (loaded on first use) and the
query engine over them."""

from __future__ import annotations

import os

from ..fast import cache_keys

TYPE_CHECKING = False
if TYPE_CHECKING:  # (a process answering from persisted plans imports none of these)
    from collections.abc import Iterable, Iterator, Mapping
    from pathlib import Path
    from typing import Any

    from ..data.buckets import KeyedTable
    from ..data.catalog import Catalog, TableRef
    from ..data.loader import TableStore
    from ..fast.plans import PlanStore
    from ..specs.models import ModelRegistry
    from .engine import Answer, Latencies, QueryEngine


class Database:
    """Tables of one data root, keyed by the head-axis convention, loaded lazily and cached.

    ``table(system, backend, version, table)`` answers from the slot's own file or, where the
    version folder's ``reuse.yaml`` declares it, from the donor version (``ref.reuse`` says so).
    Loading is strict: a table with any failure raises TableRejectedError.

    With the persisted cache on, a single answer comes from a persisted query plan where one
    holds (modperf.fast.plans), and the catalog, the model registry and the table store are made on
    first use: a process answering only from plans never scans the data root or imports numpy.
    """

    def __init__(self, data_root: str | os.PathLike[str] | None = None,
                 model_configs: Iterable[str | os.PathLike[str]] | None = None, *, cache: bool | None = None) -> None:
        self._data_root = data_root
        self._model_configs = None if model_configs is None else list(model_configs)
        #: ``cache``: keyed tables from the persisted cache (modperf.data.keyed_cache); None: on unless
        #: MODPERF_NO_CACHE is set.
        self._cache = cache
        self._catalog: Catalog | None = None
        self._models: ModelRegistry | None = None
        self._store: TableStore | None = None
        self._query_engine: QueryEngine | None = None
        self._plans: PlanStore | None = None
        if cache_keys.enabled(cache):
            from ..fast.plans import PlanStore

            self._plans = PlanStore.open(data_root, self._model_configs)
        if self._plans is None:  # no plans: open now (what is wrong with the root or configs raises here)
            _ = self.store

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            if cache_keys.enabled(self._cache):  # the scan of an earlier process, while the data root is unchanged
                from ..data import scan_cache

                self._catalog = scan_cache.scan(self._data_root)
            else:
                from ..data.catalog import Catalog

                self._catalog = Catalog.scan(self._data_root)
        return self._catalog

    @property
    def models(self) -> ModelRegistry:
        if self._models is None:
            from ..specs.models import ModelRegistry

            self._models = ModelRegistry.default(self._model_configs)
        return self._models

    @property
    def store(self) -> TableStore:
        if self._store is None:
            from ..data.loader import TableStore

            catalog = self.catalog
            self._store = TableStore(catalog, self.models, cache=self._cache)
        return self._store

    @property
    def plans(self) -> PlanStore | None:
        """The persisted query plans this database answers from (modperf.plans); None with the
        cache off or a data root or config folder that is not a plain folder."""
        return self._plans

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
        from ..data.families import family_of

        for ref in self.catalog.select(system=system, backend=backend, version=version, table=table,
                                       physical=False):
            if family_of(ref.table) is not None:
                yield self.load(ref)

    # -- queries (semantics in modperf.query.engine and docs/queries.md) ----------------------------

    @property
    def queries(self) -> QueryEngine:
        if self._query_engine is None:
            from .engine import QueryEngine

            self._query_engine = QueryEngine(self.store, self.models, plans=self._plans)
        return self._query_engine

    def query(self, /, **fields: Any) -> Answer:
        """One latency: ``db.query(table=..., system=..., backend=..., version=..., model=... |
        native_heads=..., tp_size=... | num_heads=..., <key columns>..., allow_substitute=False)``.
        Every field is a keyword (``self`` positional-only), so no field name collides with a
        Python name: an unknown one is a QueryFieldError like any other."""
        # quality notes as the engine lists them by default (on, unless its annotate_quality is off)
        engine = self._query_engine
        return self.answer(fields, quality=engine is None or engine.annotate_quality)

    def answer(self, fields: Mapping[str, Any], *, quality: bool = True, diagnose: bool = True) -> Answer:
        """``query`` with the fields as a mapping; ``quality=False`` skips the quality notes
        (model-level estimates, which make many queries, list them per table instead);
        ``diagnose=False`` refuses a point outside the grid without naming the nearest measured
        points (cheap: for callers trying several kernels)."""
        if self._query_engine is None and self._plans is not None:
            found = self._plans.answer(fields, quality)
            if found is not None:
                return found
        return self.queries.query(fields, quality=quality, diagnose=diagnose)

    def query_many(self, /, *, kinds_as_str: bool = False, **fields: Any) -> Latencies:
        """Vectorised: numpy arrays for the numeric axes (batch_size, isl, step, num_tokens, and
        num_heads where it is the heads axis) of one table group, scalars for everything else.
        Returns latencies (NaN where refused) and kind codes (0 exact, 1 interpolated,
        2 extrapolated, -1 refused: ``modperf.KINDS``), or with ``kinds_as_str`` their names;
        unpacks as ``latency_ms, kinds``."""
        found = self.queries.query_many(fields)
        if kinds_as_str:
            import dataclasses

            import numpy as np

            from ..fast.lattice import KINDS

            # the names in code order, indexed by code + 1 (refused is -1)
            names = np.array([KINDS[code] for code in sorted(KINDS)])
            found = dataclasses.replace(found, kind=names[found.kind.astype(np.int64) - min(KINDS)])
        return found


def open(data_root: str | os.PathLike[str] | None = None,  # noqa: A001  (modperf.open, by design)
         model_configs: Iterable[str | os.PathLike[str]] | None = None, *, cache: bool | None = None) -> Database:
    """The database of a data root (the embedded corpus by default); ``cache=False`` keys every
    table from its file instead of the persisted cache (modperf.data.keyed_cache)."""
    return Database(data_root, model_configs, cache=cache)
