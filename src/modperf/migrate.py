"""``modperf migrate``: rewrite old tables to rank-local ``num_heads``, losslessly, or refuse.

Two patterns are migrated; everything else is left alone or refused, never guessed at.

*Stale native* (``stale_native``): inside one (model, version) group, ``num_heads`` equals the
model's native head count on every row while ``tp_size`` varies: the convention retired by the
DeepSeek-V4 migration. The group's rows get ``num_heads = native // tp_size``; every other
column, the schema, the row order and the file's compression stay as they were. A group that
is partly stale (some tp>1 rows native, others rank-local), whose constant count is not the
native, or whose native does not divide by a tp_size is refused with the offending groups, and
the whole file is left untouched. Groups already rank-local are left as they are.

*Legacy without num_heads* (``legacy_no_num_heads``, CSV ``.txt`` or parquet): the table never
recorded a head count. The native comes from ``--model`` (no default: the retired consumers
assumed 128, which mislabels every other native) or from the table's own ``model`` column;
``num_heads = native // tp_size``. The output is parquet in the schema the corpus uses today
for that table (:mod:`modperf.schema`), written beside the original or under ``--out``; the
original is kept. Columns the legacy file lacks are filled only where something decides them:
``num_heads`` (derived), ``model`` (``--model``), ``architecture`` (the model config's single
architecture), ``--fill COLUMN=VALUE``, or otherwise the one value that every corpus file of
the same table and framework records (TRTLLM MLA-kernel tables all say
``kernel_source = "default"``); a column nothing decides refuses the file.

Native-keyed sparse-kernel tables are never touched (their ``num_heads`` is the native count
by contract). Tables without ``tp_size`` (GQA attention, mla_bmm) have no tp axis to migrate.

A dry run (the default) returns the plan. ``execute`` writes each planned file atomically
(:mod:`modperf.atomic`): the temporary file is verified (row count, every other column value
for value, schema, ``num_heads * tp_size == native`` on every tp>1 row, and the strict loader)
before it takes the target's name, and the target is then checked with ``modperf check``. If
any file's plan is refused, nothing at all is written.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from . import errors as E
from .atomic import parquet_writer, write_atomically
from .catalog import PARQUET_SUFFIX, TableRef, refs_for_paths
from .check import check
from .families import Family, Tier, family_of, head_bearing_tables
from .families.base import ARCHITECTURE, HEADS, MODEL, TP
from .load import try_load
from .models import ModelConfig, ModelRegistry
from .schema import CorpusSchema, column_evidence, corpus_schema
from .validate import validate_table

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


# --- reading ---------------------------------------------------------------------------------


def read_source(path: Path, column_types: Mapping[str, pa.DataType] | None = None,
                columns: Sequence[str] | None = None) -> pa.Table:
    """Read a table exactly as stored (no dictionary encoding: the schema must survive).

    CSV columns that the corpus schema names are parsed as the corpus types, so that a value
    such as version ``1.0`` stays a string and heads stay integers. ``columns`` reads only
    those (parquet), which is all a plan needs until it has found something to rewrite.
    """
    try:
        if path.name.endswith(".parquet"):
            if columns is not None:
                names = pq.read_schema(path).names
                return pq.read_table(path, columns=[c for c in columns if c in names])
            return pq.read_table(path)
        options = pacsv.ConvertOptions(column_types=dict(column_types or {}))
        return pacsv.read_csv(path, convert_options=options)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise E.UnreadableTableError(
            f"cannot read table: {exc}", file=path,
            fix="the file is truncated or not a parquet/CSV table: restore it from its source",
        ) from exc


def _strings(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    encoded = column.dictionary_encode().combine_chunks()
    return (encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64),
            [str(v) for v in encoded.dictionary.to_pylist()])


def _ints(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy().astype(np.int64, copy=False)


# --- planning --------------------------------------------------------------------------------


def _sorted_unique(values: np.ndarray) -> list[int]:
    return [int(v) for v in np.unique(values)]


#: (state, reason, the error a refused group is reported under)
Classification = tuple[str, "str | None", "type[E.ModperfError] | None"]


def _classify(heads: np.ndarray, tp: np.ndarray, native: int) -> Classification:
    """The state of one (model, version) group whose native is known."""
    tps, distinct_heads = np.unique(tp), np.unique(heads)
    if tps.size >= 2 and distinct_heads.size == 1 and int(distinct_heads[0]) == native:
        undivided = [int(t) for t in tps if native % int(t)]
        if undivided:
            return (GROUP_REFUSED, f"native {native} does not divide by tp_size {undivided}",
                    E.HeadsNotDivisibleError)
        return GROUP_STALE, None, None
    multi = tp > 1
    local_ok = heads * tp == native
    if not (multi & ~local_ok).any():
        return GROUP_RANK_LOCAL, None, None
    at_native = multi & (heads == native)
    if at_native.any() and ((multi & local_ok).any() or ((~multi) & (heads != native)).any()):
        return (GROUP_REFUSED, "partly stale: some rows hold the native count at tp>1, others are rank-local",
                E.PartlyStaleError)
    if distinct_heads.size == 1 and tps.size >= 2:
        return (GROUP_REFUSED, f"num_heads is constant ({int(distinct_heads[0])}) while tp_size varies, but is not "
                               f"the model's native {native}", E.MigrationRefusedError)
    if at_native.any():
        return (GROUP_REFUSED, "native count at a single tp_size > 1: the stale fingerprint needs tp_size to vary "
                               "within the group, so the rows cannot be told apart from mislabelled ones",
                E.MigrationRefusedError)
    return GROUP_REFUSED, "tp>1 rows that are neither rank-local nor the stale pattern", E.MigrationRefusedError


def _groups(table: pa.Table, forced_model: str | None) -> tuple[np.ndarray, list[tuple[str | None, str | None]]]:
    """Group id per row and (model, version) per group, in order of first appearance."""
    n = table.num_rows
    if MODEL in table.column_names:
        m_codes, m_values = _strings(table.column(MODEL))
    else:
        m_codes, m_values = np.zeros(n, dtype=np.int64), [forced_model]
    if "version" in table.column_names:
        v_codes, v_values = _strings(table.column("version"))
    else:
        v_codes, v_values = np.zeros(n, dtype=np.int64), [None]
    combined = m_codes * (len(v_values) + 1) + v_codes
    _, first, group = np.unique(combined, return_index=True, return_inverse=True)
    # renumber groups by first appearance, so plans read in file order
    rank = np.argsort(np.argsort(first))
    group = rank[group.reshape(-1)]
    order = np.argsort(first)
    keys = []
    for g in order:
        row = int(first[g])
        keys.append((m_values[int(m_codes[row])], v_values[int(v_codes[row])]))
    return group, keys


def _config(registry: ModelRegistry, model: str, path: Path | None, rows: np.ndarray | None = None) -> ModelConfig:
    try:
        cfg = registry.get(model)
        cfg.native_heads  # noqa: B018  (validates num_attention_heads)
        return cfg
    except E.ModelError as exc:
        kwargs: dict[str, Any] = {}
        if rows is not None:
            kwargs = {"rows": rows[: E.ROWS_SHOWN].tolist(), "row_count": int(rows.size)}
        raise type(exc)(exc.detail, file=path, values={"model": model, **exc.values}, fix=exc.fix, **kwargs) from None


def _refusal_errors(plan: FilePlan, refused: list[tuple[GroupPlan, type[E.ModperfError], np.ndarray]]) -> None:
    """One typed error per kind of refusal, each listing its groups and their rows."""
    by_kind: dict[type[E.ModperfError], list[tuple[GroupPlan, np.ndarray]]] = {}
    for group, cls, rows in refused:
        by_kind.setdefault(cls, []).append((group, rows))
    for cls, members in by_kind.items():
        gs = [g for g, _ in members]
        rows = np.sort(np.concatenate([r for _, r in members]))
        what = {E.PartlyStaleError: "partly stale group(s)",
                E.HeadsNotDivisibleError: "group(s) whose native does not divide by tp_size"}.get(
            cls, "group(s) that show neither the stale pattern nor rank-local heads")
        plan.refuse(cls(
            f"{len(gs)} {what}; the file is left untouched (nothing is guessed)",
            file=plan.source, rows=rows[: E.ROWS_SHOWN].tolist(), row_count=int(rows.size),
            values={"groups": [g.brief() for g in gs]},
            fix="re-collect these groups with rank-local num_heads (native // tp_size), or split the file so that "
                "each group is either wholly stale or wholly rank-local, then migrate again",
        ))


def _usable_head_columns(plan: FilePlan, table: pa.Table) -> bool:
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


def _plan_stale(plan: FilePlan, table: pa.Table, registry: ModelRegistry, model: str | None,
                read_full: Callable[[], pa.Table]) -> None:
    """``table`` holds at least model, version, num_heads and tp_size; ``read_full`` reads the
    whole file once a rewrite is planned."""
    if not _usable_head_columns(plan, table):
        return
    has_model = MODEL in table.column_names
    if model is not None and has_model:
        plan.notes.append("--model is not used: the table names each row's model")
    heads, tp = _ints(table, HEADS), _ints(table, TP)
    group, keys = _groups(table, None if has_model else model)
    row_lists = [np.flatnonzero(group == g) for g in range(len(keys))]
    native_per_row = np.full(table.num_rows, -1, dtype=np.int64)
    groups: list[GroupPlan] = []
    refused: list[tuple[GroupPlan, type[E.ModperfError], np.ndarray]] = []
    needs_model: list[GroupPlan] = []
    for (name, version), rows in zip(keys, row_lists):
        gh, gt = heads[rows], tp[rows]
        gp = GroupPlan(name, version, int(rows.size), None, _sorted_unique(gt), _sorted_unique(gh), GROUP_RANK_LOCAL)
        groups.append(gp)
        fingerprint = len(gp.tp_sizes) >= 2 and len(gp.num_heads_before) == 1
        if not has_model and not fingerprint:
            # a table without a model column records native as num_heads * tp_size per row (files
            # mix tp chains of several natives): without the fingerprint there is nothing to migrate
            continue
        if name is None:
            gp.status, gp.reason = GROUP_REFUSED, "stale fingerprint, but the table records no model"
            needs_model.append(gp)
            continue
        try:
            cfg = _config(registry, name, plan.source, rows)
        except E.ModelError as exc:
            gp.status, gp.reason = GROUP_REFUSED, "model has no usable config"
            plan.refuse(exc)
            continue
        gp.native = cfg.native_heads
        native_per_row[rows] = gp.native
        gp.status, gp.reason, error = _classify(gh, gt, gp.native)
        if error is not None:
            refused.append((gp, error, rows))
        if gp.status == GROUP_STALE:
            gp.num_heads_after = {t: gp.native // t for t in gp.tp_sizes}
            gp.rows_changed = int((gh != gp.native // gt).sum())
    plan.groups = groups
    plan.native_per_row = native_per_row
    if needs_model:
        plan.refuse(E.ModelRequiredError(
            "num_heads is constant while tp_size varies (the stale fingerprint), and the table has no model column "
            "to take the native head count from", file=plan.source,
            values={"groups": [g.brief() for g in needs_model]},
            fix=f"run `modperf migrate {plan.source} --model MODEL_ID` with the model whose native head count the "
                "constant num_heads is",
        ))
    if refused:
        _refusal_errors(plan, refused)
    stale = [g for g in groups if g.status == GROUP_STALE]
    if stale or refused or needs_model:
        plan.pattern = STALE
    elif plan.ok:
        plan.pattern = RANK_LOCAL
    if not plan.ok or not stale:
        return
    new_heads = heads.copy()
    for g, rows in zip(groups, row_lists):
        if g.status == GROUP_STALE:
            new_heads[rows] = g.native // tp[rows]
    try:
        table = read_full()
    except E.ModperfError as exc:
        plan.refuse(exc)
        return
    plan.source_table = table
    index = table.schema.get_field_index(HEADS)
    heads_field = table.schema.field(index)
    plan.migrated = table.set_column(index, heads_field, pa.array(new_heads, type=heads_field.type))
    plan.rows_changed = int((new_heads != heads).sum())
    plan.action = REWRITE


def _native_for_legacy(plan: FilePlan, table: pa.Table, registry: ModelRegistry, model: str | None
                       ) -> tuple[np.ndarray, dict[str, ModelConfig]] | None:
    """Per-row native for a legacy table: from its model column, else from --model."""
    n = table.num_rows
    if MODEL in table.column_names:
        codes, names = _strings(table.column(MODEL))
        configs: dict[str, ModelConfig] = {}
        natives = np.zeros(len(names), dtype=np.int64)
        for i, name in enumerate(names):
            try:
                configs[name] = _config(registry, name, plan.source, np.flatnonzero(codes == i))
            except E.ModelError as exc:
                plan.refuse(exc)
                continue
            natives[i] = configs[name].native_heads
        if model is not None:
            plan.notes.append("--model is not used: the table names each row's model")
        return (natives[codes], configs) if not plan.refusals else None
    if model is None:
        plan.refuse(E.ModelRequiredError(
            "legacy table without num_heads: its head axis is unknown until you name the model it was collected "
            "for (there is no default; the retired loaders assumed 128, which mislabels every other native)",
            file=plan.source, values={"table": plan.table},
            fix=f"run `modperf migrate {plan.source} --model MODEL_ID` (for the DeepSeek-V3-shaped MLA kernel "
                "tables: --model deepseek-ai/DeepSeek-V3)",
        ))
        return None
    try:
        cfg = _config(registry, model, plan.source)
    except E.ModelError as exc:
        plan.refuse(exc)
        return None
    return np.full(n, cfg.native_heads, dtype=np.int64), {model: cfg}


def _check_kernel_dims(plan: FilePlan, family: Family, configs: Mapping[str, ModelConfig]) -> None:
    """A family collected at fixed dims (the MLA kernel) can only be labelled with a model of
    those dims: another model's native would be a head count the kernel never ran for."""
    dims = family.notes.get("kernel_dims") if family.notes else None
    if not dims:
        return
    for name, cfg in configs.items():
        seen = {k: cfg.get(k, None) for k in dims}
        if seen != dict(dims):
            plan.refuse(E.MigrationRefusedError(
                f"{name} does not have the dims the {family.title} tables are collected at", file=plan.source,
                values={"model": name, "model_dims": seen, "table_dims": dict(dims)},
                fix="pass --model with a model of these dims (the DeepSeek-V3 family for the MLA kernel tables)",
            ))


def _fill_value(name: str, value: str, t: pa.DataType) -> Any:
    if pa.types.is_integer(t):
        return int(value)
    if pa.types.is_floating(t):
        return float(value)
    return value


def _plan_legacy(plan: FilePlan, table: pa.Table, family: Family, cs: CorpusSchema, registry: ModelRegistry,
                 model: str | None, fills: Mapping[str, str], data_root: str | None) -> None:
    plan.pattern = LEGACY
    n = table.num_rows
    names = table.column_names
    if TP not in names:
        plan.refuse(E.MissingColumnError(
            "legacy table has neither num_heads nor tp_size: num_heads = native // tp_size cannot be derived",
            file=plan.source, values={"table": plan.table, "column": TP},
            fix="re-collect the table with rank-local num_heads",
        ))
        return
    if not _usable_head_columns(plan, table):
        return
    unknown = [c for c in names if c not in cs.names]
    if unknown:
        plan.refuse(E.UnexpectedColumnError(
            f"column(s) {unknown} are not in the corpus schema of {plan.table}", file=plan.source,
            values={"columns": unknown, "corpus_columns": cs.names},
            fix="drop or rename these columns (the corpus schema is the layout most corpus files of the table use)",
        ))
    resolved = _native_for_legacy(plan, table, registry, model)
    if resolved is None:
        return
    natives, configs = resolved
    _check_kernel_dims(plan, family, configs)
    tp = _ints(table, TP)
    if (tp <= 0).any():
        rows = np.flatnonzero(tp <= 0)
        plan.refuse(E.InvalidHeadsError("tp_size must be a positive integer", file=plan.source,
                                        rows=rows[:5].tolist(), row_count=int(rows.size),
                                        values={"examples": tp[rows[:3]].tolist()},
                                        fix="re-collect these rows"))
        return
    undivided = natives % tp != 0
    if undivided.any():
        rows = np.flatnonzero(undivided)
        plan.refuse(E.HeadsNotDivisibleError(
            "native // tp_size is not a whole number of heads", file=plan.source, rows=rows[:5].tolist(),
            row_count=int(rows.size),
            values={"tp_sizes": _sorted_unique(tp[rows]), "natives": _sorted_unique(natives[rows])},
            fix="these rows cannot have been measured for this model at that tp_size: check --model",
        ))
    heads = natives // np.where(tp > 0, tp, 1)

    # columns the legacy file lacks
    columns: dict[str, pa.Array | pa.ChunkedArray] = {}
    frameworks = table.column("framework").unique().to_pylist() if "framework" in names else []
    for col in cs.schema:
        if col.name in names:
            continue
        if col.name == HEADS:
            columns[HEADS] = pa.array(heads, type=col.type)
            continue
        value, source = None, None
        if col.name in fills:
            value, source = _fill_value(col.name, fills[col.name], col.type), "--fill"
        elif col.name == MODEL and model is not None:
            value, source = model, "--model"
        elif col.name == ARCHITECTURE and model is not None and len(configs) == 1:
            archs = list(configs[model].raw.get("architectures") or [])
            if len(archs) == 1:
                value, source = archs[0], f"the architectures field of {model}'s config"
        elif len(frameworks) == 1:
            evidence = column_evidence(plan.table, col.name, str(frameworks[0]), data_root)
            if evidence.decided is not None:
                value = evidence.decided
                source = (f"every {frameworks[0]} {plan.table} table in the corpus ({evidence.files} files) records "
                          f"{col.name} = {value!r}")
            elif evidence.values:
                plan.refuse(E.FillUndecidedError(
                    f"the legacy file has no {col.name!r} column and the corpus's {frameworks[0]} {plan.table} "
                    "tables record more than one value", file=plan.source,
                    values={"column": col.name, "corpus_values": evidence.values},
                    fix=f"pass --fill {col.name}=VALUE with the value this collection used",
                ))
                continue
        if value is None:
            plan.refuse(E.FillUndecidedError(
                f"the legacy file has no {col.name!r} column and nothing decides its value", file=plan.source,
                values={"column": col.name, "frameworks": frameworks},
                fix=f"pass --fill {col.name}=VALUE with the value this collection used",
            ))
            continue
        plan.filled[col.name] = {"value": value, "source": source}
        columns[col.name] = pa.array([value] * n, type=col.type)
    if plan.refusals:
        return
    arrays = []
    for col in cs.schema:
        if col.name in columns:
            arrays.append(columns[col.name])
            continue
        try:
            arrays.append(table.column(col.name).cast(col.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            plan.refuse(E.ColumnTypeError(
                f"column {col.name!r} ({table.column(col.name).type}) cannot be stored as {col.type}: {exc}",
                file=plan.source, values={"column": col.name}, fix=f"correct the {col.name!r} values",
            ))
    if plan.refusals:
        return
    plan.filled[HEADS] = {"value": "native // tp_size",
                          "source": ", ".join(f"native {c.native_heads} from {m}'s config" for m, c in configs.items())}
    plan.migrated = pa.Table.from_arrays(arrays, schema=cs.schema)
    plan.native_per_row = natives
    plan.rows_changed = n
    per_tp: dict[int, int] = {}
    for t, h in zip(tp.tolist(), heads.tolist()):
        per_tp.setdefault(t, h)
    name = model if MODEL not in names else None
    plan.groups = [GroupPlan(name, None, n, int(natives[0]) if len(set(natives.tolist())) == 1 else None,
                             _sorted_unique(tp), [], GROUP_LEGACY, dict(sorted(per_tp.items())), n)]
    plan.action = WRITE


def _target(ref: TableRef, out: Path | None) -> Path:
    name = f"{ref.table}{PARQUET_SUFFIX}"
    if out is None:
        return ref.path.with_name(name)
    if ref.system is not None:
        relative = Path(ref.system, ref.family_dir or "", ref.backend or "", ref.version or "", name)
    else:
        relative = Path(name)
    target = out / relative
    if not target.resolve().is_relative_to(out.resolve()):
        raise E.PathOutsideOutputError(
            "the migrated file would land outside the output folder", file=target,
            values={"out": str(out), "resolved": str(target.resolve())},
            fix="pass table paths without '..' components, and make sure no symlink inside --out points elsewhere",
        )
    return target


def _holds(path: Path, expected: pa.Table | None) -> bool:
    try:
        return expected is not None and pq.read_table(path).equals(expected, check_metadata=True)
    except (pa.ArrowException, OSError):
        return False


def _prevalidate(plan: FilePlan, ref: TableRef, family: Family, registry: ModelRegistry) -> None:
    """The migrated table must pass every guard before anything is written."""
    assert plan.migrated is not None
    _, failures = validate_table(ref, family, registry, table=plan.migrated)
    if failures:
        plan.refuse(E.MigrationRefusedError(
            f"the migrated table would still fail {len(failures)} loader guard(s) "
            f"({', '.join(sorted({f.kind for f in failures}))}); nothing is written", file=plan.source,
            values={"first": str(failures[0])},
            fix="fix the problems `modperf check` lists for this file (they are not head-axis problems migrate "
                "can repair), then migrate again",
        ))
        plan.refusals.extend(failures)


def plan_file(ref: TableRef, registry: ModelRegistry, *, model: str | None = None, out: Path | None = None,
              fills: Mapping[str, str] | None = None, data_root: str | None = None) -> FilePlan:
    """Read one table and decide what migration does to it. Never writes, never raises for data
    problems (they are the plan's ``refusals``)."""
    plan = FilePlan(ref.path, ref.table, format=ref.format, ref=ref)
    family = family_of(ref.table)
    if family is None or not family.head_bearing:
        plan.refuse(E.UnknownTableError(
            f"{ref.table!r} is not a head-bearing table", file=ref.path,
            fix="migrate only rewrites the head axis of the tables declared in modperf/families/",
        ))
        return plan
    plan.family, plan.tier = family.name, family.tier.value
    if family.tier is Tier.NATIVE:
        plan.pattern = NATIVE_KEYED
        plan.notes.append("native-keyed by contract (num_heads is the native count): never migrated")
        try:
            plan.rows = pq.read_metadata(ref.path).num_rows if ref.format == "parquet" else 0
        except (pa.ArrowException, OSError):
            pass
        return plan
    try:
        cs = corpus_schema(ref.table, data_root)
        types = {f.name: f.type for f in cs.schema} if ref.format == "csv" else None
        # a parquet plan starts from the head columns alone; most files need nothing more
        slim = (MODEL, "version", HEADS, TP) if ref.format == "parquet" else None
        table = read_source(ref.path, types, slim)
        if ref.format == "parquet":
            meta = pq.read_metadata(ref.path)
            if meta.num_row_groups:
                codec = meta.row_group(0).column(0).compression
                plan.compression = "none" if codec == "UNCOMPRESSED" else codec.lower()
                plan.row_group_size = max(meta.row_group(i).num_rows for i in range(meta.num_row_groups)) or None
    except (E.ModperfError, pa.ArrowException, OSError) as exc:
        if not isinstance(exc, E.ModperfError):
            exc = E.UnreadableTableError(f"cannot read table metadata: {exc}", file=ref.path,
                                         fix="the file is truncated or not parquet: restore it from its source")
        plan.pattern = UNREADABLE if isinstance(exc, E.UnreadableTableError) else plan.pattern
        plan.refuse(exc)
        return plan
    plan.rows = table.num_rows
    fills = dict(fills or {})

    def read_full() -> pa.Table:
        return read_source(ref.path, types) if slim is not None else table

    if HEADS not in table.column_names:
        try:
            table = read_full()
        except E.ModperfError as exc:
            plan.refuse(exc)
            return plan
        plan.source_table = table
        _plan_legacy(plan, table, family, cs, registry, model, fills, data_root)
    elif TP not in table.column_names:
        plan.pattern = NO_TP_AXIS
        plan.notes.append("no tp_size column: num_heads is the local count by construction; nothing to migrate")
    else:
        _plan_stale(plan, table, registry, model, read_full)
    if not plan.will_write or plan.refusals:
        return plan
    try:
        plan.target = _target(ref, out)
    except E.ModperfError as exc:
        plan.refuse(exc)
        return plan
    if plan.action == WRITE and plan.target == ref.path:
        plan.refuse(E.TargetExistsError(
            "the migrated parquet would replace the legacy original, which migration keeps", file=plan.target,
            fix="pass --out DIR to write the migrated table elsewhere",
        ))
        return plan
    replacing_source = out is None and plan.target == ref.path
    if not replacing_source and plan.target.exists() and _holds(plan.target, plan.migrated):
        # an earlier run wrote exactly this: nothing to do, so a re-run stays clean
        plan.action = NOTHING
        plan.notes.append(f"already migrated: {plan.target} holds exactly this result")
        return plan
    if not replacing_source and plan.target.exists():
        plan.refuse(E.TargetExistsError(
            "target already exists", file=plan.target,
            fix="remove it (it may be an earlier migration of this file), or pass --out DIR",
        ))
        return plan
    if replacing_source:
        plan.notes.append("rewrites the file in place (atomically); pass --out DIR to keep the original")
    else:
        plan.notes.append("writes a new file; the original is kept")
    _prevalidate(plan, ref, family, registry)
    return plan


# --- verification and execution ---------------------------------------------------------------


def verify_written(plan: FilePlan, written_path: Path, registry: ModelRegistry) -> dict[str, bool]:
    """Check a written file against its plan; raise MigrationVerificationError on any mismatch."""
    assert plan.source_table is not None and plan.migrated is not None and plan.ref is not None
    source, expected = plan.source_table, plan.migrated
    try:
        written = pq.read_table(written_path)
    except (pa.ArrowException, OSError) as exc:
        raise E.MigrationVerificationError(f"cannot read back the written file: {exc}", file=plan.target,
                                           fix="check the disk; the original is unchanged") from exc
    problems: list[str] = []
    result: dict[str, bool] = {}
    result["row_count"] = written.num_rows == source.num_rows
    if not result["row_count"]:
        problems.append(f"row count {written.num_rows} != {source.num_rows}")
    if plan.pattern == STALE:
        result["schema"] = written.schema.equals(source.schema, check_metadata=True)
    else:
        result["schema"] = written.schema.equals(expected.schema, check_metadata=True)
    if not result["schema"]:
        problems.append("schema differs from the plan")
    others_equal = True
    if result["row_count"]:
        for name in source.column_names:
            if name == HEADS or name not in written.column_names:
                continue
            original = source.column(name)
            target_type = written.schema.field(name).type
            if original.type != target_type:
                original = original.cast(target_type)
            if not written.column(name).equals(original):
                others_equal = False
                problems.append(f"column {name!r} changed")
    result["other_columns_equal"] = others_equal and result["row_count"]
    rank_local = False
    if result["row_count"] and HEADS in written.column_names and TP in written.column_names:
        heads, tp = _ints(written, HEADS), _ints(written, TP)
        native = plan.native_per_row
        if native is not None:
            known = native > 0
            rank_local = bool(((tp <= 1) | ~known | (heads * tp == native)).all())
        else:
            rank_local = True
    result["rank_local"] = rank_local
    if not rank_local:
        problems.append("a tp>1 row has num_heads * tp_size != native")
    result["equals_plan"] = written.equals(expected, check_metadata=True)
    if not result["equals_plan"]:
        problems.append("content differs from the planned table")
    loaded = try_load(TableRef(plan.table, written_path), registry)
    result["strict_load"] = loaded.ok
    if not loaded.ok:
        problems.append(f"strict load failed: {loaded.failures[0]}")
    if problems:
        raise E.MigrationVerificationError(
            "the written file does not match the plan: " + "; ".join(problems), file=plan.target,
            values={"checks": result}, fix="nothing was replaced; report this as a modperf bug",
        )
    return result


def execute_plan(plan: FilePlan, registry: ModelRegistry, model_configs: Sequence[str] | None = None) -> None:
    """Write one planned file atomically, verifying it before and after it takes its name."""
    assert plan.will_write and plan.ok and plan.migrated is not None and plan.target is not None
    verification: dict[str, bool] = {}

    def verify(temp: Path) -> None:
        verification.update(verify_written(plan, temp, registry))

    write_atomically(plan.target, parquet_writer(plan.migrated, compression=plan.compression,
                                                 row_group_size=plan.row_group_size),
                     overwrite=plan.target == plan.source, verify=verify)
    plan.written = True
    gate = check([str(plan.target)], model_configs=model_configs, workers=1)
    verification["modperf_check"] = gate.ok
    plan.verification = verification
    if not gate.ok:
        plan.refuse(E.MigrationVerificationError(
            "the written file fails `modperf check`", file=plan.target,
            values={"first": str(gate.failures[0])}, fix="report this as a modperf bug",
        ))


def migrate(
    paths: Iterable[str | os.PathLike[str]],
    *,
    execute: bool = False,
    model: str | None = None,
    out: str | os.PathLike[str] | None = None,
    fills: Mapping[str, str] | None = None,
    model_configs: Sequence[str] | None = None,
    data_root: str | None = None,
) -> MigrationReport:
    """Plan (and with ``execute``, carry out) the migration of every table under ``paths``.

    Raises only for usage errors (no such path, unknown ``--model``, ``--out`` not a folder);
    data problems are in the report. With ``execute``, nothing is written unless every plan is
    clean.
    """
    start = time.perf_counter()
    registry = ModelRegistry.default(model_configs)
    if model is not None:
        _config(registry, model, None)  # an unknown --model is reported once, before any file is read
    out_path = Path(out).expanduser() if out is not None else None
    if out_path is not None and out_path.exists() and not out_path.is_dir():
        raise E.UsageError("--out is not a folder", file=out_path, fix="pass a folder (it is created if missing)")
    paths = [str(p) for p in paths]
    explicit = {os.path.abspath(p) for p in paths}
    # Tables without a head axis found inside a folder are skipped (as `modperf check` does);
    # one named explicitly is reported.
    refs = [r for r in refs_for_paths(paths)
            if r.table in head_bearing_tables() or os.path.abspath(r.path) in explicit]
    plans = [plan_file(ref, registry, model=model, out=out_path, fills=fills, data_root=data_root) for ref in refs]
    by_target: dict[Path, list[FilePlan]] = {}
    for p in plans:
        if p.will_write and p.target is not None:
            by_target.setdefault(p.target.resolve(), []).append(p)
    for target, same in by_target.items():
        if len(same) > 1:
            for p in same:
                p.refuse(E.TargetConflictError(
                    "several inputs would be written to the same file", file=target,
                    values={"sources": [str(q.source) for q in same]},
                    fix="migrate them one at a time with different --out folders",
                ))
    report = MigrationReport(plans, executed=False, execute_requested=execute)
    if execute and report.ok:
        report.executed = True
        for p in plans:
            if p.will_write:
                try:
                    execute_plan(p, registry, model_configs)
                except E.ModperfError as exc:
                    p.refuse(exc)
                    break  # later files stay unwritten; the report says which were written
    report.seconds = time.perf_counter() - start
    return report
