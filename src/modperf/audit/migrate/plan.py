"""Migration plans: what ``modperf migrate`` found in each file and what it does about it, and
the column helpers the stale and legacy planners share."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ...base import errors as E
from ...data.catalog import TableRef
from ...data.families.base import HEADS, MODEL, TP
from ...specs.models import ModelConfig, ModelRegistry

# Patterns a file can show.
STALE = "stale_native"
LEGACY = "legacy_no_num_heads"
RANK_LOCAL = "rank_local"  # already current: nothing to do
NATIVE_KEYED = "native_keyed"  # sparse-kernel tables: never touched
NO_TP_AXIS = "no_tp_axis"  # tables without tp_size: no head convention to migrate
UNREADABLE = "unreadable"
UNKNOWN = "unknown"

# What a plan does.
REWRITE = "rewrite"  # replace the file (or write its migrated copy under --out)
WRITE = "write"  # write a new parquet file, keep the original
NOTHING = "none"
REFUSED = "refused"

# Group states (stale pattern).
GROUP_STALE = "stale"
GROUP_RANK_LOCAL = "rank_local"
GROUP_REFUSED = "refused"
GROUP_LEGACY = "legacy"

@dataclass
class GroupPlan:
    """One (model, version) group of a table and what migration does to it."""

    model: str | None
    version: str | None
    rows: int
    native: int | None
    tp_sizes: list[int]
    num_heads_before: list[int]  # distinct values, sorted
    status: str  # stale | rank_local | refused | legacy
    #: tp_size -> num_heads after migration (stale and legacy groups)
    num_heads_after: dict[int, int] = field(default_factory=dict)
    rows_changed: int = 0
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "version": self.version, "rows": self.rows, "native": self.native,
            "tp_sizes": self.tp_sizes, "num_heads_before": self.num_heads_before,
            "num_heads_after": {str(k): v for k, v in sorted(self.num_heads_after.items())},
            "status": self.status, "rows_changed": self.rows_changed, "reason": self.reason,
        }

    def brief(self) -> dict[str, Any]:
        return {"model": self.model, "version": self.version, "rows": self.rows, "native": self.native,
                "tp_sizes": self.tp_sizes, "num_heads": self.num_heads_before, "reason": self.reason}


@dataclass
class FilePlan:
    """What migrate found in one file, what it will do (or did), and why."""

    source: Path
    table: str
    family: str | None = None
    tier: str | None = None
    format: str = "parquet"
    pattern: str = UNKNOWN
    action: str = NOTHING
    target: Path | None = None
    rows: int = 0
    rows_changed: int = 0
    groups: list[GroupPlan] = field(default_factory=list)
    #: Columns a legacy file lacks -> {"value": ..., "source": why that value}
    filled: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    refusals: list[E.ModperfError] = field(default_factory=list)
    # execution
    written: bool = False
    verification: dict[str, bool] = field(default_factory=dict)
    # what execution needs; not part of the report
    ref: TableRef | None = field(default=None, repr=False)
    source_table: pa.Table | None = field(default=None, repr=False)
    migrated: pa.Table | None = field(default=None, repr=False)
    native_per_row: np.ndarray | None = field(default=None, repr=False)
    compression: str = field(default="zstd", repr=False)
    row_group_size: int | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return not self.refusals

    @property
    def will_write(self) -> bool:
        return self.action in (REWRITE, WRITE)

    def refuse(self, error: E.ModperfError) -> None:
        self.refusals.append(error)
        self.action = REFUSED

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": str(self.source), "table": self.table, "family": self.family, "tier": self.tier,
            "format": self.format, "pattern": self.pattern, "action": self.action,
            "target": str(self.target) if self.target else None, "rows": self.rows,
            "rows_changed": self.rows_changed, "groups": [g.to_dict() for g in self.groups],
            "filled": self.filled, "notes": self.notes, "ok": self.ok,
            "refusals": [r.to_dict() for r in self.refusals], "written": self.written,
            "verification": self.verification,
        }


@dataclass
class MigrationReport:
    files: list[FilePlan]
    executed: bool  # writing started (every plan was clean)
    execute_requested: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.files)

    @property
    def failures(self) -> list[E.ModperfError]:
        return [r for f in self.files for r in f.refusals]

    @property
    def exit_code(self) -> int:
        """0 clean, else the highest exit code among the failures (usage errors are 2)."""
        return max((f.exit_code for f in self.failures), default=0)

    def count(self, action: str) -> int:
        return sum(f.action == action for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "executed": self.executed, "execute_requested": self.execute_requested,
            "seconds": round(self.seconds, 3),
            "files": [f.to_dict() for f in self.files],
            "summary": {
                "files": len(self.files), "to_write": sum(f.will_write for f in self.files),
                "written": sum(f.written for f in self.files), "unchanged": self.count(NOTHING),
                "refused": self.count(REFUSED), "rows_changed": sum(f.rows_changed for f in self.files),
            },
        }


def strings(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    encoded = column.dictionary_encode().combine_chunks()
    return (encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64),
            [str(v) for v in encoded.dictionary.to_pylist()])


def ints(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy().astype(np.int64, copy=False)


def sorted_unique(values: np.ndarray) -> list[int]:
    return [int(v) for v in np.unique(values)]


def config_of(registry: ModelRegistry, model: str, path: Path | None, rows: np.ndarray | None = None) -> ModelConfig:
    try:
        cfg = registry.get(model)
        cfg.native_heads  # noqa: B018  (validates num_attention_heads)
        return cfg
    except E.ModelError as exc:
        kwargs: dict[str, Any] = {}
        if rows is not None:
            kwargs = {"rows": rows[: E.ROWS_SHOWN].tolist(), "row_count": int(rows.size)}
        raise type(exc)(exc.detail, file=path, values={"model": model, **exc.values}, fix=exc.fix, **kwargs) from None


def usable_head_columns(plan: FilePlan, table: pa.Table) -> bool:
    """Integer heads and tp, no nulls in the grouping columns; otherwise the loader's report
    is the right place to look, not a migration."""
    for name in (HEADS, TP, MODEL, "version"):
        if name not in table.column_names:
            continue
        column = table.column(name)
        if name in (HEADS, TP) and not pa.types.is_integer(column.type):
            plan.refuse(E.ColumnTypeError(f"column {name!r} is {column.type}, expected an integer type",
                                          file=plan.source, values={"column": name},
                                          fix=f"run `modperf check {plan.source}` and fix what it lists first"))
        elif column.null_count:
            plan.refuse(E.NullValueError(f"null {name!r} on {column.null_count} row(s)", file=plan.source,
                                         values={"column": name},
                                         fix=f"run `modperf check {plan.source}` and fix what it lists first"))
    return plan.ok
