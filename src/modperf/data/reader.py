"""The one table reader: a parquet or legacy CSV perf table as an Arrow table (or, for a
large table, its columns row group by row group into narrow arrays: :func:`read_narrow_columns`).

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

import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..base import errors as E
from .codes import narrowest_int, narrowest_signed, to_numpy

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


#: What a CSV header holds: column names. A first line that is anything else (a line of
#: /etc/passwd behind a symlink) means the file is not a table, and is never quoted.
_COLUMN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,127}")
#: The parts of pyarrow's CSV errors that describe the file's shape, not its content (the rest of
#: such a message quotes the offending row, which may be anything the file holds).
_CSV_SHAPE = (re.compile(r"CSV parse error: Expected \d+ columns, got \d+"),
              re.compile(r"In CSV column #\d+: Row #\d+: CSV conversion error to \w+"),
              re.compile(r"Empty CSV file"))


def _reason(path: Path, exc: BaseException) -> str:
    """Why a read failed, in words that quote nothing from the file's content."""
    text = str(exc)
    if isinstance(exc, OSError) and not isinstance(exc, pa.ArrowException) and exc.strerror:
        return exc.strerror
    if is_csv(path):
        for pattern in _CSV_SHAPE:
            found = pattern.search(text)
            if found:
                return found.group()
        return f"not a CSV table ({type(exc).__name__})"
    # parquet errors describe the footer and metadata, not row content; keep the first line
    return E.clean(text.splitlines()[0] if text else type(exc).__name__, 300)


def _unreadable(path: Path, exc: BaseException) -> E.UnreadableTableError:
    return E.UnreadableTableError(f"cannot read table: {_reason(path, exc)}", file=path, fix=_UNREADABLE_FIX)


def _check_names(path: Path, names: list[str]) -> None:
    """Column names that can key a table: unique, and (in a CSV) names at all."""
    if is_csv(path) and not all(_COLUMN_NAME.fullmatch(n) for n in names):
        raise E.UnreadableTableError(
            "the first line is not a header of column names: not a perf table", file=path, fix=_UNREADABLE_FIX)
    repeated = sorted(n for n, count in Counter(names).items() if count > 1)
    if repeated:
        raise E.DuplicateColumnError(
            f"column name(s) {', '.join(map(E.quote, repeated[:5]))} appear more than once: which column keys "
            "the rows cannot be told", file=path, values={"columns": repeated},
            fix="rename or drop the duplicate columns (re-export the table from its source)")


def read_schema(path: Path) -> pa.Schema:
    """The stored schema of a table file (a CSV is read whole to infer it)."""
    try:
        if is_csv(path):
            import pyarrow.csv as pacsv

            schema = pacsv.read_csv(path).schema
        else:
            schema = pq.read_schema(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _unreadable(path, exc) from None
    _check_names(path, schema.names)
    return schema


def read_table(
    path: Path,
    *,
    as_stored: bool = False,
    columns: Iterable[str] | None = None,
    csv_types: Mapping[str, pa.DataType] | None = None,
    meta: pq.FileMetaData | None = None,
) -> pa.Table:
    """Read one table file; any read failure becomes UnreadableTableError naming the file.

    ``columns`` reads only those columns (the ones the file has). ``csv_types`` parses the
    named CSV columns as those types (a version ``1.0`` stays a string, heads stay integers).
    ``meta``: the parquet footer, where the caller has parsed it with :func:`read_footer`.
    """
    path = Path(path)
    wanted = list(columns) if columns is not None else None
    try:
        if is_csv(path):
            import pyarrow.csv as pacsv

            options = pacsv.ConvertOptions(column_types=dict(csv_types or {}))
            whole = pacsv.read_csv(path, convert_options=options)
            _check_names(path, whole.column_names)
            if wanted is None:
                return whole
            return whole.select([c for c in whole.column_names if c in wanted])
        if meta is None:  # the footer, parsed once (its names checked): its schema, then the reader's
            meta = read_footer(path)
        schema = meta.schema.to_arrow_schema()
        names = [c for c in schema.names if wanted is None or c in wanted]
        strings = [] if as_stored else [f.name for f in schema if f.name in names and is_string_type(f.type)]
        with pq.ParquetFile(path, read_dictionary=strings, metadata=meta) as handle:
            return handle.read(columns=names)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _unreadable(path, exc) from None


def read_footer(path: Path) -> pq.FileMetaData:
    """The parsed footer of a parquet file (its column names checked as :func:`read_table`
    checks them)."""
    try:
        meta = pq.read_metadata(path)
        names = meta.schema.to_arrow_schema().names
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _unreadable(path, exc) from None
    _check_names(path, names)
    return meta


def read_row_groups(path: Path, meta: pq.FileMetaData) -> Iterator[pa.Table]:
    """Every column of a parquet file, one row group at a time, strings dictionary-encoded (as
    :func:`read_table` reads them for loading): a big table's decoded columns never live whole.
    Any read failure becomes UnreadableTableError."""
    schema = meta.schema.to_arrow_schema()
    strings = [f.name for f in schema if is_string_type(f.type)]
    try:
        with pq.ParquetFile(path, read_dictionary=strings, metadata=meta) as handle:
            for i in range(meta.num_row_groups):
                yield handle.read_row_group(i)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _unreadable(path, exc) from None


def read_layout(path: Path) -> tuple[str, int | None]:
    """(compression codec, largest row group) of a parquet file, so that a rewrite keeps them."""
    try:
        meta = pq.read_metadata(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _unreadable(path, exc) from None
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
        raise _unreadable(path, exc) from None


#: (the float column's key among the stored names)
LATENCY_KEY = "\0latency"


@dataclass
class NarrowColumns:
    """Columns read row group by row group (:func:`read_narrow_columns`)."""

    rows: int
    strings: dict[str, tuple[np.ndarray, list[str]]]  # name -> (codes, values)
    integers: dict[str, np.ndarray]
    floats: dict[str, np.ndarray]  # by stored name


class _Growing:
    """One column in the narrowest type seen so far, filled part by part: allocated at the
    first part (a part that is the whole column is only cast, without a copy where its type is
    already the column's) and widened (one copy) when a part holds a value the type cannot, to
    the narrowest type holding every value put so far."""

    def __init__(self, n: int, dtype: np.dtype, narrowest: Callable[[int, int], np.dtype] = narrowest_signed
                 ) -> None:
        self.n = n
        self.array: np.ndarray | None = None
        self.narrowest = narrowest
        self.seen: tuple[int, int] | None = None  # the smallest and largest value put
        self._set_type(dtype)

    def _set_type(self, dtype: np.dtype) -> None:
        self.dtype = dtype
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            self.low, self.high = int(info.min), int(info.max)

    def put(self, at: int, values: np.ndarray, low: int = 0, high: int = 0) -> None:
        if self.dtype.kind in "iu":
            if self.seen is not None:
                low, high = min(low, self.seen[0]), max(high, self.seen[1])
            self.seen = (low, high)
            if low < self.low or high > self.high:
                self._set_type(self.narrowest(low, high))
                if self.array is not None:
                    self.array = self.array.astype(self.dtype)  # (the rows not yet put: overwritten later)
        if self.array is None:
            if values.size == self.n:
                self.array = values.astype(self.dtype, copy=False)
                return
            self.array = np.empty(self.n, dtype=self.dtype)
        self.array[at: at + values.size] = values

    def whole(self) -> np.ndarray:
        assert self.array is not None
        return self.array


def read_narrow_columns(path: Path, meta: pq.FileMetaData, strings: Mapping[str, str], ints: Mapping[str, str],
                        latency: str) -> NarrowColumns | None:
    """The columns named (each given as name -> stored name; ``latency`` a stored float
    column), read one row group at a time into preallocated arrays: integers in the narrowest
    integer type that holds them (the footer's statistics choose it, a row group outside them
    widens it), strings as codes in the narrowest type over one dictionary (each row group's
    dictionary values in order of first appearance, the order arrow's dictionary unification
    gives, so the codes and values are the whole read's), the float column as float64. Every
    column read is decoded (a damaged one fails as in a whole read). None where a column holds
    nulls or is not dictionary-encoded, or the file fails to read: the caller then reads it
    whole, which says what is wrong."""
    stored = {**strings, **ints, LATENCY_KEY: latency}
    n = int(meta.num_rows)
    # the footer's min/max of each integer column choose its type (checked on every row group)
    leaf = {meta.row_group(0).column(j).path_in_schema: j for j in range(meta.num_columns)} \
        if meta.num_row_groups else {}
    integers: dict[str, _Growing] = {}
    for c in ints:
        low, high = 0, 0
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(leaf[stored[c]]).statistics if stored[c] in leaf else None
            if stats is None or not stats.has_min_max:
                low, high = 0, 0
                break
            low, high = min(low, int(stats.min)), max(high, int(stats.max))
        integers[c] = _Growing(n, narrowest_int(low, high), narrowest_int)
    codes = {c: _Growing(n, np.dtype(np.int8)) for c in strings}
    values: dict[str, dict[str, int]] = {c: {} for c in strings}
    latency_column = _Growing(n, np.dtype(np.float64))
    at = 0
    try:
        for group in read_row_groups(path, meta):
            size = group.num_rows
            for c in strings:
                pos = at
                for chunk in group.column(stored[c]).chunks:
                    if chunk.null_count or not pa.types.is_dictionary(chunk.type):
                        return None
                    words = [str(v) for v in chunk.dictionary.to_pylist()]
                    seen = values[c]
                    if len(set(words)) != len(words):
                        return None
                    remap = [seen.setdefault(w, len(seen)) for w in words]
                    index = to_numpy(chunk.indices)
                    if remap != list(range(len(remap))):
                        index = np.asarray(remap, dtype=np.int64)[index]
                    codes[c].put(pos, index, 0, len(seen) - 1)
                    pos += len(chunk)
            for c in ints:
                pos = at
                for chunk in group.column(stored[c]).chunks:
                    if chunk.null_count:
                        return None
                    part = to_numpy(chunk)
                    if part.size:
                        integers[c].put(pos, part, int(part.min()), int(part.max()))
                    pos += len(chunk)
            pos = at
            for chunk in group.column(stored[LATENCY_KEY]).chunks:
                if chunk.null_count:
                    return None
                latency_column.put(pos, to_numpy(chunk))
                pos += len(chunk)
            at += size
            del group
    except E.UnreadableTableError:
        return None
    if at != n:
        return None
    return NarrowColumns(n, {c: (codes[c].whole(), list(values[c])) for c in strings},
                         {c: integers[c].whole() for c in ints}, {latency: latency_column.whole()})



__all__ = ["NarrowColumns", "is_csv", "is_string_type", "read_footer", "read_layout", "read_narrow_columns",
           "read_row_count", "read_row_groups", "read_schema", "read_table", "stored_type"]
