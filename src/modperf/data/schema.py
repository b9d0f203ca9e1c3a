"""The schema the corpus uses today for each table, read from the corpus itself.

Migration (legacy tables) and the collector-side writer both write "in the corpus schema".
Rather than a second, hand-kept copy of every layout, modperf reads the layouts of the
embedded corpus's files of that table and takes the one most files use (ties: the layout with
more columns, the newer shape, then the first in column order). Types are normalised the way
the bulk of the corpus stores them: strings as ``string`` (a few writers produced
``large_string``; the values are the same), integers as ``int64``, latency as ``double``.

It also answers the question a legacy table raises for a column it lacks: which values do
the corpus files of the same table and the same framework record? (Every TRTLLM MLA-kernel
table records ``kernel_source = "default"``, for instance.)
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..base import errors as E
from .catalog import PARQUET_SUFFIX, resolve_data_root
from .reader import read_schema, read_table


def normalise_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_large_string(t) or pa.types.is_string(t):
        return pa.string()
    return t


@dataclass(frozen=True)
class CorpusSchema:
    """One table's column layout as the corpus writes it today."""

    table: str
    schema: pa.Schema
    family_dir: str  # the corpus folder the table lives in (mla, sparse_attention, ...)
    files_with_layout: int
    files: tuple[Path, ...] = field(repr=False)  # every corpus parquet file of the table

    @property
    def names(self) -> list[str]:
        return list(self.schema.names)

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "columns": [{"name": f.name, "type": str(f.type)} for f in self.schema],
            "family_dir": self.family_dir,
            "files_with_layout": self.files_with_layout,
            "files": len(self.files),
        }


def _corpus_files(table: str, root: Path) -> list[Path]:
    return sorted(root.glob(f"*/*/*/*/{table}{PARQUET_SUFFIX}"))


@functools.lru_cache(maxsize=64)
def _schema_cached(table: str, root: str) -> CorpusSchema:
    files = _corpus_files(table, Path(root))
    if not files:
        raise E.UnknownTableError(
            f"the corpus holds no {table} table, so its schema is unknown",
            values={"table": table, "data_root": root},
            fix="check the table name (see `modperf ls --all`), or point MODPERF_DATA_ROOT at a corpus that has it",
        )
    layouts: Counter[tuple[tuple[str, str], ...]] = Counter()
    typed: dict[tuple[tuple[str, str], ...], pa.Schema] = {}
    family_dirs: Counter[str] = Counter()
    for path in files:
        raw = read_schema(path)
        schema = pa.schema([pa.field(f.name, normalise_type(f.type)) for f in raw])
        key = tuple((f.name, str(f.type)) for f in schema)
        layouts[key] += 1
        typed[key] = schema
        family_dirs[path.parts[-4]] += 1
    best = max(layouts, key=lambda k: (layouts[k], len(k), [n for n, _ in k]))
    return CorpusSchema(table, typed[best], family_dirs.most_common(1)[0][0], layouts[best], tuple(files))


def corpus_schema(table: str, data_root: str | os.PathLike[str] | None = None) -> CorpusSchema:
    """The layout the most corpus files of ``table`` use (default root: the embedded corpus)."""
    root = resolve_data_root(data_root)
    return _schema_cached(table, str(root))


@dataclass(frozen=True)
class ColumnEvidence:
    """Which values corpus files of one table record in one column, where ``framework`` matches."""

    table: str
    column: str
    framework: str
    values: dict[str, int]  # value -> number of files recording it
    files: int  # files of this table and framework that have the column

    @property
    def decided(self) -> str | None:
        return next(iter(self.values)) if len(self.values) == 1 else None


def column_evidence(table: str, column: str, framework: str,
                    data_root: str | os.PathLike[str] | None = None) -> ColumnEvidence:
    """Values of ``column`` in the corpus files of ``table`` whose rows say ``framework``."""
    cs = corpus_schema(table, data_root)
    per_value: Counter[str] = Counter()
    files = 0
    for path in cs.files:
        names = read_schema(path).names
        if column not in names or "framework" not in names:
            continue
        t = read_table(path, as_stored=True, columns=["framework", column])
        mask = pc.equal(t.column("framework"), framework)
        chosen = t.filter(mask).column(column)
        if len(chosen) == 0:
            continue
        files += 1
        for value in set(chosen.to_pylist()):
            per_value[str(value)] += 1
    return ColumnEvidence(table, column, framework, dict(per_value.most_common()), files)
