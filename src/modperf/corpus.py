"""Loading many tables for the audit commands (dedupe, coverage, quality).

The audits need more than ``try_load`` hands back: dedupe needs the validated rows and the raw
arrow table (to write it back), coverage needs each row's tp_size. This module runs the same
guards (``validate_table`` then ``build_buckets``) and keeps what the audits need, in a thread
pool like ``modperf check``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import pyarrow as pa

from . import errors as E
from .buckets import KeyedTable, build_buckets
from .catalog import Catalog, TableRef, refs_for_paths
from .families import family_of, head_bearing_tables
from .families.base import Family
from .models import ModelRegistry
from .validate import ValidatedTable, read_arrow, validate_table

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class Loaded:
    """One table after every guard: the validated rows, the keyed table, and (on request) the
    arrow table as read. ``failures`` is non-empty exactly when ``keyed`` is None."""

    ref: TableRef
    family: Family | None
    validated: ValidatedTable | None
    keyed: KeyedTable | None
    arrow: pa.Table | None = None
    failures: list[E.ModperfError] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.keyed is not None


def load_one(ref: TableRef, registry: ModelRegistry, *, keep_arrow: bool = False) -> Loaded:
    """Validate and key one table; data problems land in ``failures``, never raise."""
    start = time.perf_counter()
    family = family_of(ref.table)
    if family is None:
        failure = E.UnknownTableError(
            f"{ref.table!r} is not a head-bearing table modperf keys", file=ref.path,
            fix="head-bearing tables are declared in modperf/families/")
        return Loaded(ref, None, None, None, failures=[failure], seconds=time.perf_counter() - start)
    try:
        arrow = read_arrow(ref.path)
    except E.UnreadableTableError as exc:
        return Loaded(ref, family, None, None, failures=[exc], seconds=time.perf_counter() - start)
    validated, failures = validate_table(ref, family, registry, arrow)
    keyed = build_buckets(validated) if validated is not None else None
    return Loaded(ref, family, validated, keyed, arrow if keep_arrow else None, failures,
                  time.perf_counter() - start)


def parallel_map(fn: Callable[[T], R], items: Sequence[T], workers: int | None = None,
                 on_done: Callable[[int, int, R], None] | None = None) -> list[R]:
    """``fn`` over ``items`` in a thread pool (numpy and arrow release the GIL), in order."""
    workers = workers or min(4, os.cpu_count() or 1)
    out: list[R] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for i, result in enumerate(pool.map(fn, items), 1):
            out.append(result)
            if on_done is not None:
                on_done(i, len(items), result)
    return out


def select_refs(paths: Sequence[str] | None = None, *, data_root: str | None = None,
                table: str | None = None, physical: bool = True,
                system: str | None = None, backend: str | None = None,
                version: str | None = None) -> tuple[list[TableRef], Catalog | None]:
    """The head-bearing tables an audit covers: the named files/folders, or every table of the
    data root (physical files, or reuse-resolved slots with ``physical=False``)."""
    heads = set(head_bearing_tables())
    if table is not None and table not in heads:
        raise E.UnknownTableError(
            f"{table!r} is not a head-bearing table", values={"table": table},
            fix=f"choose one of: {', '.join(sorted(heads))}")
    if paths:
        explicit = {os.path.abspath(p) for p in paths}
        refs = [r for r in refs_for_paths(paths)
                if (table is None or r.table == table)
                and (r.table in heads or os.path.abspath(r.path) in explicit)
                and (system is None or r.system == system) and (backend is None or r.backend == backend)
                and (version is None or r.version == version)]
        return refs, None
    catalog = Catalog.scan(data_root)
    refs = catalog.select(system=system, backend=backend, version=version, table=table, tables=heads,
                          physical=physical)
    return refs, catalog


def version_key(version: str | None) -> tuple:
    """Order backend versions the way releases go: 0.5.6.post2 < 0.5.9 < 0.5.10 and
    1.3.0rc20 < 1.3.0rc23 < 1.3.0 (a pre-release sorts before its release)."""
    if version is None:
        return ()
    key: list[tuple[int, int | str]] = []
    for part in re.findall(r"\d+|[A-Za-z]+", version):
        if part.isdigit():
            key.append((2, int(part)))
        elif part.lower() in ("post",):
            key.append((3, part))  # post releases follow the release
        else:
            key.append((0, part.lower()))  # rc, dev, a, b: before the release
    key.append((1, ""))  # a release sorts after its pre-releases, before its post releases
    return tuple(key)


__all__ = ["Loaded", "load_one", "parallel_map", "select_refs", "version_key"]
