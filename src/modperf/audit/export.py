"""``modperf export``: the measured rows of a system's tables in one file a user takes away.

Every selected (system, backend, version, table) slot is loaded with every guard, as a query
loads it, and its points (:meth:`modperf.data.buckets.KeyedTable.to_arrow`: key columns, axes,
``latency_ms``, ``merged_rows``, ``models``) get the slot columns ``system, backend, version,
table, family`` in front; the tables are stacked into one (a column one table lacks is null
there). The file is parquet or CSV by its suffix, written through the one atomic path
(:mod:`modperf.base.atomic`: a temporary file, read back and counted, then renamed), and an existing
file is replaced only with ``force``. A table that fails to load fails the export: nothing is
written, and every failure is listed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base import errors as E
from ..base.atomic import write_atomically
from ..data.families import family_of
from ..data.parquet_files import parquet_writer

if TYPE_CHECKING:
    import os

    import pyarrow as pa

    from ..data.catalog import TableRef
    from ..query.db import Database

#: The columns every exported row starts with: where it was measured.
SLOT_COLUMNS = ("system", "backend", "version", "table", "family")
#: File suffix -> format.
FORMATS = {".parquet": "parquet", ".csv": "csv"}


@dataclass
class ExportResult:
    """What an export read and wrote."""

    out: str
    format: str
    tables: list[str] = field(default_factory=list)  # the slots exported, system/backend/version/table
    rows: int = 0
    columns: list[str] = field(default_factory=list)
    written: bool = False
    failures: list[E.ModperfError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures and self.written

    def to_dict(self) -> dict[str, Any]:
        return {"out": self.out, "format": self.format, "written": self.written, "rows": self.rows,
                "tables": self.tables, "columns": self.columns, "failures": [f.to_dict() for f in self.failures]}


def format_of(out: str | os.PathLike[str]) -> str:
    """The format a file name asks for (by its suffix); anything else is a UsageError."""
    suffix = Path(out).suffix.lower()
    if suffix not in FORMATS:
        raise E.OptionValueError(f"--out must end in {' or '.join(FORMATS)}, not {E.quote(suffix or str(out))}",
                                 values={"out": str(out)}, fix="name the file e.g. rows.parquet or rows.csv")
    return FORMATS[suffix]


def select(db: Database, *, system: str, table: str | None = None, backend: str | None = None,
           version: str | None = None) -> list[TableRef]:
    """The declared slots the filters select (reuse-resolved, as queries read them); a filter
    naming something the data root does not hold is an UnknownTableError with the nearest
    names."""
    db.catalog.refuse_unknown(system=system, backend=backend, version=version, table=table)
    refs = [r for r in db.catalog.select(system=system, backend=backend, version=version, table=table,
                                         physical=False) if family_of(r.table) is not None]
    if not refs:
        asked = ", ".join(f"{k} {v}" for k, v in (("system", system), ("backend", backend), ("version", version),
                                                  ("table", table)) if v is not None)
        raise E.NotCoveredError(f"no table modperf declares for {asked}",
                                values={"system": system, "backend": backend, "version": version, "table": table},
                                fix="see `modperf ls --all` for what the data root holds")
    return refs


def rows(db: Database, refs: list[TableRef], failures: list[E.ModperfError] | None = None) -> pa.Table:
    """Every point of ``refs`` with the slot columns (module doc). A table that fails to load
    is added to ``failures`` when given (and left out), else raised."""
    import pyarrow as pa

    parts = []
    for ref in refs:
        try:
            points = db.load(ref).to_arrow()
        except E.ModperfError as exc:
            if failures is None:
                raise
            failures.append(exc)
            continue
        fam = family_of(ref.table)
        n = points.num_rows
        slot = {"system": ref.system, "backend": ref.backend, "version": ref.version, "table": ref.table,
                "family": fam.name if fam else None}
        columns = {name: pa.array([slot[name]] * n, pa.string()) for name in SLOT_COLUMNS}
        columns.update({name: points.column(name) for name in points.column_names})
        parts.append(pa.table(columns))
    if not parts:
        return pa.table({name: pa.array([], pa.string()) for name in SLOT_COLUMNS})
    return pa.concat_tables(parts, promote_options="permissive")


def _csv_writer(table: pa.Table) -> Any:
    def write(handle: Any) -> None:
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, handle)

    return write


def _verify(fmt: str, expected: int) -> Any:
    def verify(path: Path) -> None:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            found = pq.read_metadata(path).num_rows
        else:
            import pyarrow.csv as pcsv

            found = pcsv.read_csv(path).num_rows
        if found != expected:
            raise E.WriteFailedError(f"the written file holds {found:,} rows, not {expected:,}", file=path,
                                     fix="run again; the target was not changed")

    return verify


def export(db: Database | None, out: str | os.PathLike[str], *, system: str, table: str | None = None,
           backend: str | None = None, version: str | None = None, force: bool = False) -> ExportResult:
    """Write the measured rows of the selected slots to ``out`` (module doc); the result says
    what was written, or which tables failed (then nothing is)."""
    from ..query.db import Database

    fmt = format_of(out)
    target = Path(out)
    if not force and (target.exists() or target.is_symlink()):
        raise E.TargetExistsError("the export file already exists", file=target,
                                  fix="pass --force to replace it, or choose another --out")
    db = db if db is not None else Database()
    refs = select(db, system=system, table=table, backend=backend, version=version)
    result = ExportResult(str(target), fmt, tables=[f"{r.system}/{r.backend}/{r.version}/{r.table}" for r in refs])
    data = rows(db, refs, result.failures)
    if result.failures:  # fail closed: a partial export would read as the whole system
        return result
    result.rows, result.columns = data.num_rows, list(data.column_names)
    write = parquet_writer(data, owner="modperf export") if fmt == "parquet" else _csv_writer(data)
    write_atomically(target, write, overwrite=force, verify=_verify(fmt, data.num_rows))
    result.written = True
    return result


__all__ = ["FORMATS", "SLOT_COLUMNS", "ExportResult", "export", "format_of", "rows", "select"]
