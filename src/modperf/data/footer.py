"""A parquet file's footer read without pyarrow: what one column's statistics say.

A catalog scan reads the release a collective library's table filed in a framework folder
records (its ``version`` column, :mod:`modperf.data.catalog`); a scan is otherwise a listing of
folders, and importing pyarrow for that would cost a cold process more than the whole scan.
Where the footer's statistics show one value on every row (every row group: no nulls, minimum
equal to maximum), that value is the column's only one; otherwise (no statistics, several
values, not a parquet file) the caller reads the column with pyarrow.

The footer is the Thrift compact encoding of ``FileMetaData`` (parquet-format's
``parquet.thrift``); it is decoded into nested plain values (a struct as a dict by field id),
bounded by the footer's own length. Standard library only.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: The footer length modperf decodes at most (a perf table's is a few kB).
MAX_FOOTER = 1 << 22
#: Statistics longer than this may be truncated by a writer: not trusted as a whole value.
MAX_STAT = 64

# FileMetaData / RowGroup / ColumnChunk / ColumnMetaData / Statistics field ids (parquet.thrift)
_ROW_GROUPS, _COLUMNS, _META, _PATH, _NUM_VALUES, _STATS = 4, 1, 3, 3, 5, 12
_MAX_DEPRECATED, _MIN_DEPRECATED, _NULLS, _MAX, _MIN = 1, 2, 3, 5, 6


class _Compact:
    """A reader of the Thrift compact protocol over one buffer (errors: ValueError)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise ValueError("footer ends early")
        self.at += 1
        return self.data[self.at - 1]

    def varint(self) -> int:
        out = shift = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 70:
                raise ValueError("varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def value(self, kind: int, depth: int = 0) -> Any:
        if depth > 32:
            raise ValueError("footer nested too deep")
        if kind in (1, 2):  # booleans (a list element carries its own byte)
            return kind == 1
        if kind == 3:
            return self.byte()
        if kind in (4, 5, 6):
            return self.zigzag()
        if kind == 7:
            self.at += 8
            return None
        if kind == 8:
            size = self.varint()
            if self.at + size > len(self.data):
                raise ValueError("footer ends early")
            self.at += size
            return self.data[self.at - size:self.at]
        if kind in (9, 10):
            head = self.byte()
            size, item = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            if size > len(self.data):
                raise ValueError("list longer than the footer")
            if item in (1, 2):
                return [self.byte() == 1 for _ in range(size)]
            return [self.value(item, depth + 1) for _ in range(size)]
        if kind == 11:
            size = self.varint()
            if not size:
                return {}
            types = self.byte()
            return {self.value(types >> 4, depth + 1): self.value(types & 0x0F, depth + 1) for _ in range(size)}
        if kind == 12:
            return self.struct(depth + 1)
        raise ValueError(f"unknown thrift type {kind}")

    def struct(self, depth: int = 0) -> dict[int, Any]:
        out: dict[int, Any] = {}
        field = 0
        while True:
            head = self.byte()
            kind = head & 0x0F
            if kind == 0:
                return out
            delta = head >> 4
            field = field + delta if delta else self.zigzag()
            out[field] = self.value(kind, depth)


def file_metadata(path: str | os.PathLike[str]) -> dict[int, Any] | None:
    """The decoded ``FileMetaData`` of a parquet file; None when it is not one (or its footer
    cannot be read or decoded)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 12:
                return None
            f.seek(size - 8)
            tail = f.read(8)
            length = int.from_bytes(tail[:4], "little")
            if tail[4:] != b"PAR1" or not 0 < length <= min(size - 12, MAX_FOOTER):
                return None
            f.seek(size - 8 - length)
            data = f.read(length)
        return _Compact(data).struct()
    except (OSError, ValueError, RecursionError):
        return None


def constant_value(path: str | os.PathLike[str], column: str) -> str | None:
    """The one value a top-level string column holds on every row, as its statistics show it
    (every row group with values: no nulls, minimum equal to maximum, both the same); None
    where the footer does not show that (read the column to know)."""
    meta = file_metadata(path)
    if meta is None:
        return None
    found: set[bytes] = set()
    try:
        for group in meta.get(_ROW_GROUPS, []):
            chunks = [c.get(_META, {}) for c in group.get(_COLUMNS, [])]
            (chunk,) = [m for m in chunks if m.get(_PATH) == [column.encode()]]
            if not chunk.get(_NUM_VALUES):
                continue
            stats = chunk.get(_STATS)
            if not stats or stats.get(_NULLS) != 0:
                return None
            low, high = stats.get(_MIN, stats.get(_MIN_DEPRECATED)), stats.get(_MAX, stats.get(_MAX_DEPRECATED))
            if low is None or low != high or len(low) >= MAX_STAT:
                return None
            found.add(low)
        if len(found) != 1:
            return None
        return found.pop().decode()
    except (ValueError, AttributeError, TypeError, UnicodeDecodeError):
        return None


__all__ = ["constant_value", "file_metadata"]
