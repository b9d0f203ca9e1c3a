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
for that table (:mod:`modperf.data.schema`), written beside the original or under ``--out``; the
original is kept. Columns the legacy file lacks are filled only where something decides them:
``num_heads`` (derived), ``model`` (``--model``), ``architecture`` (the model config's single
architecture), ``--fill COLUMN=VALUE``, or otherwise the one value that every corpus file of
the same table and framework records (TRTLLM MLA-kernel tables all say
``kernel_source = "default"``); a column nothing decides refuses the file.

Native-keyed sparse-kernel tables are never touched (their ``num_heads`` is the native count
by contract). Tables without ``tp_size`` (GQA attention, mla_bmm) have no tp axis to migrate.

A dry run (the default) returns the plan. ``execute`` writes each planned file atomically
(:mod:`modperf.base.atomic`): the temporary file is verified once (row count, every other column
value for value, schema, ``num_heads * tp_size == native`` on every tp>1 row, and the strict
loader ``modperf check`` runs) before it takes the target's name. If any file's plan is
refused, nothing at all is written.

The package splits by concern: :mod:`.plan` (what a plan is), :mod:`.stale` and
:mod:`.legacy` (the two patterns), :mod:`.execute` (writing and verification).
"""


from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pyarrow as pa

from ...base import errors as E
from ...base.atomic import sweep
from ...data.catalog import PARQUET_SUFFIX, TableRef, refs_for_paths
from ...data.families import Family, Tier, family_of, model_head_axis_tables
from ...data.families.base import HEADS, MODEL, TP
from ...data.reader import read_layout, read_row_count, read_table
from ...data.schema import corpus_schema
from ...data.validate import validate_table
from ...specs.models import ModelRegistry
from .execute import execute_plan, verify_written
from .legacy import plan_legacy
from .plan import (
    LEGACY,
    NATIVE_KEYED,
    NO_TP_AXIS,
    NOTHING,
    RANK_LOCAL,
    REFUSED,
    REWRITE,
    STALE,
    UNKNOWN,
    UNREADABLE,
    WRITE,
    FilePlan,
    GroupPlan,
    MigrationReport,
    config_of,
)
from .stale import plan_stale


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


def _found_in(ref: TableRef, paths: Sequence[str]) -> Path:
    """The command-line folder a table was found under (for a file named itself: its folder)."""
    here = Path(os.path.abspath(ref.path))
    for p in paths:
        arg = Path(os.path.abspath(Path(p).expanduser()))
        if arg == here:
            return here.parent
        if here.is_relative_to(arg):
            return arg
    return here.parent


def _holds(path: Path, expected: pa.Table | None) -> bool:
    try:
        return expected is not None and read_table(path, as_stored=True).equals(expected, check_metadata=True)
    except E.UnreadableTableError:
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
              fills: Mapping[str, str] | None = None, data_root: str | None = None,
              link_root: Path | None = None) -> FilePlan:
    """Read one table and decide what migration does to it. Never writes, never raises for data
    problems (they are the plan's ``refusals``). A table that is a symbolic link is rewritten
    in place only where the link points inside ``link_root`` (the folder it was found in; by
    default the link's own folder): the target is rewritten and the link stays."""
    plan = FilePlan(ref.path, ref.table, format=ref.format, ref=ref)
    family = family_of(ref.table)
    if family is None or not family.model_head_axis:
        plan.refuse(E.UnknownTableError(
            f"{ref.table!r} is not a table with the model's head axis", file=ref.path,
            fix="migrate only rewrites the head axis of the tables declared in modperf/families/",
        ))
        return plan
    plan.family, plan.tier = family.name, family.tier.value
    if family.tier is Tier.NATIVE:
        plan.pattern = NATIVE_KEYED
        plan.notes.append("native-keyed by contract (num_heads is the native count): never migrated")
        with contextlib.suppress(E.UnreadableTableError):
            plan.rows = read_row_count(ref.path) if ref.format == "parquet" else 0
        return plan
    try:
        cs = corpus_schema(ref.table, data_root)
        types = {f.name: f.type for f in cs.schema} if ref.format == "csv" else None
        # a parquet plan starts from the head columns alone; most files need nothing more
        slim = (MODEL, "version", HEADS, TP) if ref.format == "parquet" else None
        table = read_table(ref.path, as_stored=True, csv_types=types, columns=slim)
        if ref.format == "parquet":
            plan.compression, plan.row_group_size = read_layout(ref.path)
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
        return read_table(ref.path, as_stored=True, csv_types=types) if slim is not None else table

    if HEADS not in table.column_names:
        try:
            table = read_full()
        except E.ModperfError as exc:
            plan.refuse(exc)
            return plan
        plan.source_table = table
        plan_legacy(plan, table, family, cs, registry, model, fills, data_root)
    elif TP not in table.column_names:
        plan.pattern = NO_TP_AXIS
        plan.notes.append("no tp_size column: num_heads is the local count by construction; nothing to migrate")
    else:
        plan_stale(plan, table, registry, model, read_full, family)
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
    if replacing_source and ref.path.is_symlink():
        real = ref.path.resolve()
        root = (link_root or ref.path.parent).resolve()
        if not real.is_relative_to(root):
            plan.refuse(E.LinkOutsideRootError(
                "the table is a symbolic link to a file outside the folder it was found in; migrating it in place "
                "would rewrite that file", file=ref.path, values={"target": str(real), "folder": str(root)},
                fix="pass --out DIR to write the migrated table elsewhere, or migrate the target where it lives"))
            return plan
        plan.notes.append(f"symbolic link: its target {real} is rewritten in place (the link stays)")
    if replacing_source:
        plan.notes.append("rewrites the file in place (atomically); pass --out DIR to keep the original")
    else:
        plan.notes.append("writes a new file; the original is kept")
    _prevalidate(plan, ref, family, registry)
    return plan


# --- verification and execution ---------------------------------------------------------------


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
        config_of(registry, model, None)  # an unknown --model is reported once, before any file is read
    out_path = Path(out).expanduser() if out is not None else None
    if out_path is not None:
        existing = next(p for p in (out_path, *out_path.absolute().parents) if p.exists() or p == p.parent)
        if not existing.is_dir():
            raise E.UsageError("--out is not a folder" if existing == out_path else "--out lies under a file",
                               file=out_path, values={"file": str(existing)},
                               fix="pass a folder (it is created if missing)")
    names = [str(p) for p in paths]
    explicit = {os.path.abspath(p) for p in names}
    # Tables without a head axis found inside a folder are skipped (as `modperf check` does);
    # one named explicitly is reported.
    refs = [r for r in refs_for_paths(names)
            if r.table in model_head_axis_tables() or os.path.abspath(r.path) in explicit]
    plans = [plan_file(ref, registry, model=model, out=out_path, fills=fills, data_root=data_root,
                       link_root=_found_in(ref, names)) for ref in refs]
    unused = sorted(set(fills or {}) - {c for p in plans for c, how in p.filled.items() if how["source"] == "--fill"})
    if unused and all(p.ok for p in plans):  # a --fill that fills nothing is a typo, never silently dropped
        raise E.OptionValueError(
            f"--fill {', '.join(map(E.quote, unused))} fills nothing: no legacy table here lacks "
            f"{'that column' if len(unused) == 1 else 'those columns'}", values={"unused": unused},
            fix="drop it; --fill is for a column a legacy table lacks and the corpus does not decide")
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
    if execute:
        # temporary files of an earlier, killed run (also where this run has nothing to write)
        for folder in sorted({f for p in plans for f in (p.source.resolve().parent, *(
                [p.target.resolve().parent] if p.target is not None else []))}):
            sweep(folder)
    if execute and report.ok:
        report.executed = True
        for p in plans:
            if p.will_write:
                try:
                    execute_plan(p, registry)
                except E.ModperfError as exc:
                    p.refuse(exc)
                    break  # later files stay unwritten; the report says which were written
    report.seconds = time.perf_counter() - start
    return report


__all__ = ["LEGACY", "NATIVE_KEYED", "NOTHING", "NO_TP_AXIS", "RANK_LOCAL", "REFUSED", "REWRITE", "STALE", "UNKNOWN",
           "UNREADABLE", "WRITE", "FilePlan", "GroupPlan", "MigrationReport", "execute_plan", "migrate", "plan_file",
           "verify_written"]
