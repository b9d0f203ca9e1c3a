"""Carrying out a plan: the migrated table is written through the one atomic path
(:mod:`modperf.base.atomic`) and verified once, as the temporary file, before it takes the target's
name: row count, every other column value for value, schema, ``num_heads * tp_size == native``
on every tp>1 row, equality with the plan, and the strict loader."""

from __future__ import annotations

from pathlib import Path

from ...base import errors as E
from ...base.atomic import write_atomically
from ...data.catalog import TableRef
from ...data.families.base import HEADS, TP
from ...data.loader import load_one
from ...data.parquet_files import parquet_writer
from ...data.reader import read_table
from ...specs.models import ModelRegistry
from .plan import STALE, FilePlan, ints


def verify_written(plan: FilePlan, written_path: Path, registry: ModelRegistry) -> dict[str, bool]:
    """Check a written file against its plan; raise MigrationVerificationError on any mismatch."""
    assert plan.source_table is not None and plan.migrated is not None and plan.ref is not None
    source, expected = plan.source_table, plan.migrated
    try:
        written = read_table(written_path, as_stored=True)
    except E.UnreadableTableError as exc:
        raise E.MigrationVerificationError(f"cannot read back the written file: {exc.detail}", file=plan.target,
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
        heads, tp = ints(written, HEADS), ints(written, TP)
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
    loaded = load_one(TableRef(plan.table, written_path), registry)
    result["strict_load"] = loaded.ok
    if not loaded.ok:
        problems.append(f"strict load failed: {loaded.failures[0]}")
    if problems:
        raise E.MigrationVerificationError(
            "the written file does not match the plan: " + "; ".join(problems), file=plan.target,
            values={"checks": result}, fix="nothing was replaced; report this as a modperf bug",
        )
    return result


def execute_plan(plan: FilePlan, registry: ModelRegistry) -> None:
    """Write one planned file atomically; it is verified once, as the temporary file, and the
    bytes that take the target's name are the bytes verified (a rename, not a copy)."""
    assert plan.will_write and plan.ok and plan.migrated is not None and plan.target is not None
    verification: dict[str, bool] = {}

    def verify(temp: Path) -> None:
        verification.update(verify_written(plan, temp, registry))

    write_atomically(plan.target, parquet_writer(plan.migrated, compression=plan.compression,
                                                 row_group_size=plan.row_group_size),
                     overwrite=plan.target == plan.source, verify=verify,
                     follow_symlink=plan.target == plan.source)  # plan_file vetted a symlinked source
    plan.written = True
    # the strict load is the gate `modperf check` runs; it ran on these bytes before the rename
    verification["modperf_check"] = verification["strict_load"]
    plan.verification = verification
