"""The one table reader: a parquet or legacy CSV perf table as an Arrow table.

Every module that reads a table file goes through :func:`read_table`, so that read failures
become one typed error and the two ways a table is wanted are explicit:

* ``as_stored=False`` (loading): string columns come back dictionary-encoded. Perf tables
  repeat a handful of strings (op names, dtypes, model ids) over every row, and decoding them
  into per-row strings is most of the cost of a plain read.
* ``as_stored=True`` (rewriting: migrate, dedupe): the schema exactly as the file stores it,
  so that what is written back keeps it.

Parquet is read through ``ParquetFile``, not ``pq.read_table``: the latter imports
``pyarrow.dataset`` and with it pandas (a third of a second on every cold command).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from . import errors as E

PARQUET_SUFFIXES = (".parquet",)
CSV_SUFFIXES = (".txt", ".csv")

_UNREADABLE_FIX = ("the file is truncated or not a parquet/CSV table: restore it from its source or "
                   "re-collect it")


def is_csv(path: Path) -> bool:
    return path.name.endswith(CSV_SUFFIXES)


def is_string_type(t: pa.DataType) -> bool:
    """A string column, plain or dictionary-encoded."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def stored_type(t: pa.DataType) -> pa.DataType:
    """The type as the file stores it (strings are read dictionary-encoded)."""
    return t.value_type if pa.types.is_dictionary(t) else t


def _unreadable(path: Path, exc: BaseException) -> E.UnreadableTableError:
    return E.UnreadableTableError(f"cannot read table: {exc}", file=path, fix=_UNREADABLE_FIX)


def read_schema(path: Path) -> pa.Schema:
    """The stored schema of a table file (a CSV is read whole to infer it)."""
    try:
        if is_csv(path):
            import pyarrow.csv as pacsv

            return pacsv.read_csv(path).schema
        return pq.read_schema(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _unreadable(path, exc) from exc


def read_table(
    path: Path,
    *,
    as_stored: bool = False,
    columns: Iterable[str] | None = None,
    csv_types: Mapping[str, pa.DataType] | None = None,
) -> pa.Table:
    """Read one table file; any read failure becomes UnreadableTableError naming the file.

    ``columns`` reads only those columns (the ones the file has). ``csv_types`` parses the
    named CSV columns as those types (a version ``1.0`` stays a string, heads stay integers).
    """
    path = Path(path)
    wanted = list(columns) if columns is not None else None
    try:
        if is_csv(path):
            import pyarrow.csv as pacsv

            options = pacsv.ConvertOptions(column_types=dict(csv_types or {}))
            if wanted is not None:
                header = pacsv.read_csv(path, convert_options=options).column_names
                options.include_columns = [c for c in header if c in wanted]
            return pacsv.read_csv(path, convert_options=options)
        schema = pq.read_schema(path)
        names = [c for c in schema.names if wanted is None or c in wanted]
        strings = [] if as_stored else [f.name for f in schema if f.name in names and is_string_type(f.type)]
        with pq.ParquetFile(path, read_dictionary=strings) as handle:
            return handle.read(columns=names)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _unreadable(path, exc) from exc


def read_layout(path: Path) -> tuple[str, int | None]:
    """(compression codec, largest row group) of a parquet file, so that a rewrite keeps them."""
    try:
        meta = pq.read_metadata(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _unreadable(path, exc) from exc
    if not meta.num_row_groups:
        return "zstd", None
    codec = meta.row_group(0).column(0).compression
    largest = max(meta.row_group(i).num_rows for i in range(meta.num_row_groups)) or None
    return ("none" if codec == "UNCOMPRESSED" else codec.lower()), largest


def read_row_count(path: Path) -> int:
    """Rows of a table file, from the parquet footer where there is one."""
    try:
        if is_csv(path):
            return read_table(path).num_rows
        return int(pq.read_metadata(path).num_rows)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _unreadable(path, exc) from exc


__all__ = ["is_csv", "is_string_type", "read_layout", "read_row_count", "read_schema", "read_table",
           "stored_type"]
