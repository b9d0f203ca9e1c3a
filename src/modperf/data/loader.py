"""Loading tables: one file through every guard, many files under one scope, and the lazy
per-database cache.

* :func:`load_one` reads a table (:mod:`modperf.data.reader`), runs every guard
  (:func:`modperf.data.validate.validate_table`), keys it (:func:`modperf.data.buckets.build_buckets`)
  and runs the declared guards about its points as a whole (:mod:`modperf.data.keyed_guards`).
  Its result, :class:`Loaded`, is the one result type of a load: data problems are in
  ``failures``, never raised. :func:`load_table` is the strict form.
* :class:`Scope` names what a whole-corpus command covers (system, backend, version, table,
  family, explicit paths, data root, model configs); :func:`load_many` loads every table of a
  scope in a thread pool and hands each result (or each group of results) to the command's own
  reducer, so that big arrays are dropped as soon as the command has what it needs.
* :class:`TableStore` is the lazy cache a :class:`modperf.Database` answers queries from.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..base import errors as E
from ..fast.cache_keys import enabled
from ..specs.models import ModelRegistry
from . import keyed_cache
from .buckets import KeyedTable
from .catalog import Catalog, TableRef, refs_for_paths, sidecar_problems, suggest
from .families import declared_tables, family_of, model_head_axis_tables
from .families import registry as family_registry
from .families.base import Family
from .versions import version_key

if TYPE_CHECKING:  # reading, validation and keying load on first use: a cached table needs none of them
    import pyarrow as pa

    from .validate import ValidatedTable

T = TypeVar("T")
R = TypeVar("R")


# --- one table --------------------------------------------------------------------------------


@dataclass
class Loaded:
    """One table after every guard: the keyed table and, on request, the validated rows and
    the arrow table as read. ``failures`` is non-empty exactly when ``keyed`` is None."""

    ref: TableRef
    family: Family | None
    validated: ValidatedTable | None
    keyed: KeyedTable | None
    arrow: pa.Table | None = None
    failures: list[E.ModperfError] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.keyed is not None and not self.failures


def load_one(ref: TableRef, registry: ModelRegistry, *, keep_arrow: bool = False,
             keep_validated: bool = False) -> Loaded:
    """Validate and key one table; data problems land in ``failures``, never raise.
    ``validated`` is kept where asked (the audits read it): otherwise keying takes the
    validated columns over and drops each once used (``build_buckets(consume=True)``), so
    that a big table's validated columns and its keyed arrays are never all alive at once."""
    from .buckets import build_buckets
    from .keyed_guards import check_points
    from .reader import read_table
    from .validate import validate_table

    start = time.perf_counter()
    family = family_of(ref.table)
    if family is None:
        failure = E.UnknownTableError(
            f"{ref.table!r} is not a table modperf declares", file=ref.path,
            fix="table families are declared in modperf/families/")
        return Loaded(ref, None, None, None, failures=[failure], seconds=time.perf_counter() - start)
    arrow = None
    if keep_arrow:
        try:
            arrow = read_table(ref.path)
        except E.UnreadableTableError as exc:
            return Loaded(ref, family, None, None, failures=[exc], seconds=time.perf_counter() - start)
    # without keep_arrow validate_table reads the file itself (a read failure is its one
    # failure, as above): a big table row group by row group into narrow arrays, never decoded
    # whole (validate.read_narrow), else whole, dropping the decoded table as soon as its
    # columns are typed, before validation's and keying's working arrays come
    validated, failures = validate_table(ref, family, registry, arrow)
    keyed = build_buckets(validated, consume=not keep_validated) if validated is not None else None
    if not keep_validated:
        validated = None  # emptied by keying
    if keyed is not None:
        failures = check_points(keyed)
        if failures:
            keyed = None
    return Loaded(ref, family, validated, keyed, arrow, failures,
                  time.perf_counter() - start)


def load_table(ref: TableRef, registry: ModelRegistry) -> KeyedTable:
    """Strict: the keyed table, or TableRejectedError carrying every failure."""
    loaded = load_one(ref, registry)
    if loaded.keyed is None:
        if len(loaded.failures) == 1 and isinstance(loaded.failures[0], E.UsageError):
            raise loaded.failures[0]
        raise E.TableRejectedError(ref.path, loaded.failures)
    return loaded.keyed


# --- many tables ------------------------------------------------------------------------------


def parallel_map(fn: Callable[[T], R], items: Sequence[T], workers: int | None = None,
                 on_done: Callable[[int, int, R], None] | None = None) -> list[R]:
    """``fn`` over ``items`` in a thread pool (numpy and arrow release the GIL), in order."""
    workers = workers or min(4, os.cpu_count() or 1)
    out: list[R] = []
    if workers == 1 or len(items) <= 1:
        for i, item in enumerate(items, 1):
            result = fn(item)
            out.append(result)
            if on_done is not None:
                on_done(i, len(items), result)
        return out
    from concurrent.futures import ThreadPoolExecutor  # on use: a query never needs a pool

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for i, result in enumerate(pool.map(fn, items), 1):
            out.append(result)
            if on_done is not None:
                on_done(i, len(items), result)
    return out


@dataclass(frozen=True)
class Scope:
    """What a whole-corpus command covers.

    ``paths`` (files or folders) replace the data root's catalog; otherwise every table of the
    data root matching the filters. ``physical`` selects physical files (each once); False
    selects reuse-resolved slots (a reused table answers its slot from the donor's file).
    The tables covered are every declared table (``check``, quality), or with
    ``head_axis_only`` those whose num_heads is the model's attention head axis (the head-axis
    tools: coverage, dedupe's alias audit).
    """

    paths: tuple[str, ...] | None = None
    data_root: str | None = None
    system: str | None = None
    backend: str | None = None
    version: str | None = None
    table: str | None = None
    family: str | None = None
    model_configs: tuple[str, ...] = ()
    physical: bool = True
    head_axis_only: bool = False

    @classmethod
    def of(cls, paths: Iterable[str | os.PathLike[str]] | None = None, *,
           model_configs: Iterable[str | os.PathLike[str]] | None = None, **filters: Any) -> Scope:
        """A scope from command-line style arguments (lists, Paths and None welcome)."""
        ps = tuple(str(p) for p in paths) if paths else None
        configs = tuple(str(p) for p in model_configs or ())
        root = filters.pop("data_root", None)
        return cls(ps, str(root) if root is not None else None, model_configs=configs, **filters)

    def with_(self, **changes: Any) -> Scope:
        return replace(self, **changes)

    def registry(self) -> ModelRegistry:
        return ModelRegistry.default(self.model_configs)

    def universe(self) -> set[str]:
        """Every table stem the scope's kind of command covers, before the filters."""
        return set(model_head_axis_tables() if self.head_axis_only else declared_tables())

    def tables(self) -> set[str]:
        """The table stems this scope covers (validated by name)."""
        declared = self.universe()
        if self.family is not None:
            fam = family_registry().get(self.family)
            if fam is None:
                raise E.UnknownTableError(
                    f"no table family {self.family!r}", values={"family": self.family},
                    fix="families: " + ", ".join(sorted(family_registry())))
            declared &= set(fam.table_names)
        if self.table is not None:
            if self.table not in declared:
                kind = "a table with the model's head axis" if self.head_axis_only else "a declared table"
                raise E.UnknownTableError(
                    f"{self.table!r} is not {kind}", values={"table": self.table},
                    fix=f"choose one of: {', '.join(sorted(declared))}")
            declared = {self.table}
        return declared

    def select(self) -> Selection:
        wanted = self.tables()
        if self.paths:
            explicit = {os.path.abspath(p) for p in self.paths}
            found_problems: list[E.ModperfError] = []
            found = refs_for_paths(self.paths, found_problems)
            refs = [r for r in found
                    if (self.table is None or r.table == self.table)
                    and (r.table in wanted or (os.path.abspath(r.path) in explicit and self.table is None
                                               and self.family is None))
                    and (self.system is None or r.system == self.system)
                    and (self.backend is None or r.backend == self.backend)
                    and (self.version is None or r.version == self.version)]
            universe = self.universe()
            skipped = sum(r.table not in universe for r in found) - sum(r.table not in universe for r in refs)
            return Selection(self, refs, None, found_problems + sidecar_problems(r.path.parent for r in refs),
                             skipped)
        catalog = Catalog.scan(self.data_root)
        catalog.refuse_unknown(system=self.system, backend=self.backend, version=self.version)
        refs = catalog.select(system=self.system, backend=self.backend, version=self.version, tables=wanted,
                              physical=self.physical)
        problems = list(catalog.problems) + sidecar_problems((r.path.parent for r in refs), reuse=False)
        skipped = len(catalog.files) - len(catalog.select(tables=self.universe()))
        return Selection(self, refs, catalog, problems, skipped)


@dataclass
class Selection:
    """The tables a scope selected, with the data root's own problems."""

    scope: Scope
    refs: list[TableRef]
    catalog: Catalog | None  # None when explicit paths were given
    problems: list[E.ModperfError]  # not tied to one table (reuse declarations, the layout)
    skipped: int  # tables found that the scope's commands do not cover


def load_many(
    selection: Selection,
    each: Callable[[Loaded], R],
    *,
    registry: ModelRegistry | None = None,
    keep_arrow: bool = False,
    keep_validated: bool = False,
    workers: int | None = None,
    on_progress: Callable[[int, int, Any], None] | None = None,
) -> dict[Path, R]:
    """Load every selected table file once (slots sharing a donor file share its load) and
    reduce it with ``each`` in the worker, so a whole corpus never sits in memory at once.
    Returns ``each``'s result per file path. ``keep_arrow``, ``keep_validated``: as
    :func:`load_one`."""
    registry = registry or selection.scope.registry()
    physical: dict[Path, TableRef] = {}
    for ref in selection.refs:
        physical.setdefault(ref.path, ref)
    items = list(physical.values())
    results = parallel_map(lambda r: each(load_one(r, registry, keep_arrow=keep_arrow, keep_validated=keep_validated)),
                           items, workers, on_progress)
    return {ref.path: res for ref, res in zip(items, results)}


def load_groups(
    selection: Selection,
    key: Callable[[TableRef], Hashable],
    each: Callable[[list[Loaded]], list[R]],
    *,
    registry: ModelRegistry | None = None,
    workers: int | None = None,
    on_progress: Callable[[int, int, Any], None] | None = None,
) -> list[R]:
    """Like :func:`load_many`, one group of tables at a time (files that are compared with each
    other, such as one system's versions of a table); ``each`` returns one result per file, in
    the group's order. Results come back in the selection's order."""
    registry = registry or selection.scope.registry()
    groups: dict[Hashable, list[TableRef]] = {}
    for ref in selection.refs:
        groups.setdefault(key(ref), []).append(ref)
    members = list(groups.values())
    per_group = parallel_map(lambda refs: each([load_one(r, registry) for r in refs]), members, workers,
                             on_progress)
    by_ref = {id(ref): res for refs, results in zip(members, per_group) for ref, res in zip(refs, results)}
    return [by_ref[id(ref)] for ref in selection.refs]


# --- the lazy cache behind a Database ---------------------------------------------------------


class TableStore:
    """Keyed tables of one data root, loaded on first use and cached (strict: a table with any
    failure raises TableRejectedError). A slot that ``reuse.yaml`` declares reused is answered
    from the donor's file; ``ref.reuse`` says so."""

    def __init__(self, catalog: Catalog, models: ModelRegistry, *, cache: bool | None = None) -> None:
        self.catalog = catalog
        self.models = models
        #: Whether keyed tables come from (and go to) the persisted cache (modperf.data.keyed_cache); None:
        #: on unless MODPERF_NO_CACHE is set.
        self.cache = enabled(cache)
        self._registry_fp: str | None = None
        self._tables: dict[Path, KeyedTable] = {}
        #: Files the loader rejected, with the error: a batch of a million lines asking the same
        #: rejected table reads and validates it once, not once per line.
        self._rejected: dict[Path, E.ModperfError] = {}
        self._lock = threading.Lock()
        #: Per thread, while :meth:`recording`: every table loaded (None for one rejected).
        self._recording = threading.local()

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[KeyedTable | None]]:
        """The tables this thread loads inside the block, as loaded (None for one the loader
        rejected), whether read now or held already: what a persisted plan depends on."""
        outer = getattr(self._recording, "loads", None)
        loads: list[KeyedTable | None] = []
        self._recording.loads = loads
        try:
            yield loads
        finally:
            self._recording.loads = outer
            if outer is not None:
                outer.extend(loads)

    def ref(self, system: str, backend: str, version: str, table: str) -> TableRef:
        ref = self.catalog.slot(system, backend, version, table)
        if ref is None:
            raise self.unknown_slot(system, backend, version, table)
        return ref

    def unknown_slot(self, system: str, backend: str, version: str, table: str) -> E.ModperfError:
        slots = self.catalog.slots
        values = {"table": table, "system": system, "backend": backend, "version": version}
        unreadable = [p for p in self.catalog.problems
                      if isinstance(p, (E.UnreadableFolderError, E.LinkOutsideRootError))]
        if unreadable:
            # the slot may sit in a part of the data root that could not be read: say so (exit 1)
            first = unreadable[0]
            return E.DataLayoutError(
                f"no {table} table for system={system} backend={backend} version={version} in the readable part "
                f"of {self.catalog.root}; {len(unreadable)} part(s) could not be read (first: {first.detail}, "
                f"{first.file})", values=values, fix=first.fix)
        filed = next((r for r in self.catalog.files
                      if r.misplaced is not None and r.slot == (system, backend, version, table)), None)
        if filed is not None:  # a library table in that framework folder: say where it is served, or why not
            assert filed.misplaced is not None
            placed = filed.misplaced
            where = (f"it is served as {placed.served_as} (the release its rows record)" if placed.served_as else
                     f"its release's own file {placed.held_by} answers that release" if placed.held_by else
                     "other misplaced files record the same release, so none is served")
            return E.UnknownTableError(
                f"no {table} table for system={system} backend={backend} version={version}: the {table} table "
                f"filed in that folder is read as a {placed.library} release, and {where}", file=filed.path,
                values=values,
                fix=f"ask backend={placed.library} version={placed.release}, or run `modperf check {filed.path}`")
        if not any(r.table == table for r in slots):
            near = suggest(table, {r.table for r in slots})
            return E.UnknownTableError(
                f"no {table} table under {self.catalog.root}", values=values,
                fix=(f"did you mean {', '.join(near)}? " if near else "") + "see `modperf ls --all`")
        # nearest first: the same system and backend, then the same system, then the rest
        have = sorted({(str(r.system), str(r.backend), str(r.version)) for r in slots if r.table == table},
                      key=lambda s: (s[0] != system, s[1] != backend, s[0], s[1], version_key(s[2])))
        fix = "available: " + ", ".join(f"{s}/{b}/{v}" for s, b, v in have[:12]) + (" ..." if len(have) > 12 else "")
        for name, known in (("system", {s for s, _, _ in have}), ("backend", {b for _, b, _ in have})):
            value = values[name]
            if value not in known:
                near = suggest(value, known)
                if near:
                    fix = f"did you mean {name} {', '.join(near)}? " + fix
        return E.UnknownTableError(f"no {table} table for system={system} backend={backend} version={version}",
                                   values=values, fix=fix)

    def load(self, ref: TableRef) -> KeyedTable:
        if family_of(ref.table) is None:
            raise E.UnknownTableError(f"{ref.table!r} is not a table modperf declares", file=ref.path,
                                      fix="see `modperf ls --all` for the tables a data root holds")
        with self._lock:
            cached = self._tables.get(ref.path)
            rejected = self._rejected.get(ref.path)
        loads = getattr(self._recording, "loads", None)
        if cached is not None:
            if loads is not None:
                loads.append(cached)
            return cached if cached.ref == ref else cached.seen_as(ref)
        if rejected is not None:
            if loads is not None:
                loads.append(None)
            raise rejected.with_traceback(None)
        try:
            keyed = self._build(ref)
        except E.ModperfError as exc:
            with self._lock:
                self._rejected[ref.path] = exc
            if loads is not None:
                loads.append(None)
            raise
        with self._lock:
            self._tables[ref.path] = keyed
        if loads is not None:
            loads.append(keyed)
        return keyed if keyed.ref == ref else keyed.seen_as(ref)

    def _build(self, ref: TableRef) -> KeyedTable:
        if not self.cache:
            return load_table(ref, self.models)
        if self._registry_fp is None:
            self._registry_fp = keyed_cache.registry_fingerprint(self.models)
        return keyed_cache.load_keyed(ref, self.models, load_table, registry_fp=self._registry_fp)

    def table(self, system: str, backend: str, version: str, table: str) -> KeyedTable:
        return self.load(self.ref(system, backend, version, table))


__all__ = ["Loaded", "Scope", "Selection", "TableStore", "load_groups", "load_many", "load_one", "load_table",
           "parallel_map"]
