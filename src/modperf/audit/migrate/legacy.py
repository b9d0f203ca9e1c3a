"""The legacy pattern: a table that never recorded a head count. The native comes from
``--model`` or the table's model column; ``num_heads = native // tp_size``; the output is
parquet in the schema the corpus uses today (:mod:`modperf.data.schema`), with every column the file
lacks filled only where something decides it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from ...base import errors as E
from ...base import limits
from ...data.families import Family
from ...data.families.base import ARCHITECTURE, HEADS, MODEL, TP
from ...data.schema import CorpusSchema, column_evidence
from ...specs.models import ModelConfig, ModelRegistry
from .plan import (
    GROUP_LEGACY,
    LEGACY,
    WRITE,
    FilePlan,
    GroupPlan,
    config_of,
    ints,
    sorted_unique,
    strings,
    usable_head_columns,
)


def _native_for_legacy(plan: FilePlan, table: pa.Table, registry: ModelRegistry, model: str | None
                       ) -> tuple[np.ndarray, dict[str, ModelConfig]] | None:
    """Per-row native for a legacy table: from its model column, else from --model."""
    n = table.num_rows
    if MODEL in table.column_names:
        codes, names = strings(table.column(MODEL))
        configs: dict[str, ModelConfig] = {}
        natives = np.zeros(len(names), dtype=np.int64)
        for i, name in enumerate(names):
            try:
                configs[name] = config_of(registry, name, plan.source, np.flatnonzero(codes == i))
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
        cfg = config_of(registry, model, plan.source)
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
    """A --fill value as the column's type, strictly and inside the column's range."""
    fix = f"--fill {name}=VALUE takes a value of the column's type ({t})"
    if pa.types.is_integer(t):
        return limits.parse_int(name, value, error=E.OptionValueError, fix=fix)
    if pa.types.is_floating(t):
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise E.OptionValueError(f"--fill {name} must be a finite number", values={"column": name, "value": value},
                                     fix=fix)
        return number
    if not pa.types.is_string(t) and not pa.types.is_large_string(t):
        raise E.OptionValueError(f"--fill cannot fill a {t} column", values={"column": name}, fix=fix)
    if not value:
        raise E.OptionValueError(f"--fill {name} needs a value", values={"column": name}, fix=fix)
    return value


def plan_legacy(plan: FilePlan, table: pa.Table, family: Family, cs: CorpusSchema, registry: ModelRegistry,
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
    if not usable_head_columns(plan, table):
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
    tp = ints(table, TP)
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
            values={"tp_sizes": sorted_unique(tp[rows]), "natives": sorted_unique(natives[rows])},
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
                             sorted_unique(tp), [], GROUP_LEGACY, dict(sorted(per_tp.items())), n)]
    plan.action = WRITE
