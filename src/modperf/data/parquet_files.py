"""Parquet files modperf writes: the ``write`` callback that stores a table through the one
write path (:func:`modperf.base.atomic.write_atomically`), and the owner stamp.

Output folders are owned: :func:`parquet_writer` can stamp a file as written by modperf (a key
in the parquet footer), and :func:`written_by_modperf` reads the stamp back, so a command that
writes into a folder it shares with other files can refuse to replace one it did not write.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:  # pyarrow on use
    import pyarrow as pa

#: The parquet footer key of the owner stamp.
OWNER_KEY = b"modperf.written_by"


def written_by_modperf(path: Path) -> bool:
    """Whether ``path`` is a parquet file stamped by :func:`parquet_writer` (``owner=``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.is_symlink() or not path.is_file():
            return False
        meta = pq.read_schema(path).metadata or {}
    except (pa.ArrowException, OSError, ValueError):
        return False
    return OWNER_KEY in meta


def parquet_writer(table: pa.Table, *, compression: str = "zstd", row_group_size: int | None = None,
                   owner: str | None = None) -> Callable[[BinaryIO], None]:
    """A ``write`` callback that stores ``table`` as parquet (the corpus uses zstd); ``owner``
    stamps the footer (:data:`OWNER_KEY`) so that a later run knows modperf wrote the file."""
    if owner is not None:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), OWNER_KEY: owner.encode()})

    def write(handle: BinaryIO) -> None:
        import pyarrow.parquet as pq

        pq.write_table(table, handle, compression=compression, row_group_size=row_group_size)

    return write


__all__ = ["OWNER_KEY", "parquet_writer", "written_by_modperf"]
