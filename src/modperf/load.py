"""Strict loading: one table file -> a KeyedTable, or every reason it cannot be one."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from . import errors as E
from .buckets import KeyedTable, build_buckets
from .catalog import TableRef
from .families import family_of
from .families.base import Family
from .models import ModelRegistry
from .validate import validate_table


@dataclass
class LoadResult:
    ref: TableRef
    family: Family | None
    table: KeyedTable | None
    failures: list[E.ModperfError] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.table is not None and not self.failures


def family_for(ref: TableRef) -> Family:
    family = family_of(ref.table)
    if family is None:
        raise E.UnknownTableError(
            f"{ref.table!r} is not a head-bearing table modperf keys",
            file=ref.path,
            fix="head-bearing tables are declared in modperf/families/; add a declaration to cover a new one",
        )
    return family


def try_load(ref: TableRef, registry: ModelRegistry) -> LoadResult:
    """Validate and key one table; never raises for data problems (they are in ``failures``)."""
    start = time.perf_counter()
    try:
        family = family_for(ref)
    except E.UnknownTableError as exc:
        return LoadResult(ref, None, None, [exc], time.perf_counter() - start)
    validated, failures = validate_table(ref, family, registry)
    table = build_buckets(validated) if validated is not None else None
    return LoadResult(ref, family, table, failures, time.perf_counter() - start)


def load_table(ref: TableRef, registry: ModelRegistry) -> KeyedTable:
    """Strict: the keyed table, or TableRejectedError carrying every failure."""
    result = try_load(ref, registry)
    if result.table is None:
        if len(result.failures) == 1 and isinstance(result.failures[0], E.UsageError):
            raise result.failures[0]
        raise E.TableRejectedError(ref.path, result.failures)
    return result.table
