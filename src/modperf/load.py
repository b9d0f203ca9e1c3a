"""Strict loading: one table file -> a KeyedTable, or every reason it cannot be one."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import errors as E
from .buckets import KeyedTable
from .catalog import TableRef
from .corpus import load_one
from .families.base import Family
from .models import ModelRegistry


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


def try_load(ref: TableRef, registry: ModelRegistry) -> LoadResult:
    """Validate and key one table; never raises for data problems (they are in ``failures``)."""
    loaded = load_one(ref, registry)
    return LoadResult(ref, loaded.family, loaded.keyed, loaded.failures, loaded.seconds)


def load_table(ref: TableRef, registry: ModelRegistry) -> KeyedTable:
    """Strict: the keyed table, or TableRejectedError carrying every failure."""
    result = try_load(ref, registry)
    if result.table is None:
        if len(result.failures) == 1 and isinstance(result.failures[0], E.UsageError):
            raise result.failures[0]
        raise E.TableRejectedError(ref.path, result.failures)
    return result.table
