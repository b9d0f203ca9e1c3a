"""modperf.data.footer reads what a column's statistics say without pyarrow: on every corpus file it
agrees with pyarrow reading the column, and wherever the footer cannot vouch for one value on
every row it says nothing (the catalog then reads the column)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from modperf.data.catalog import Catalog
from modperf.data.footer import constant_value, file_metadata


def test_every_corpus_files_version_column_as_pyarrow_reads_it() -> None:
    told = 0
    for ref in Catalog.scan().files:
        if ref.path.suffix != ".parquet":
            continue
        found = constant_value(ref.path, "version")
        if "version" not in pq.read_schema(ref.path).names:
            assert found is None, ref.label
            continue
        column = pq.read_table(ref.path, columns=["version"]).column("version")
        values = column.unique().to_pylist()
        if found is not None:
            assert values == [found] and column.null_count == 0, ref.label
            told += 1
        else:
            assert len(values) != 1 or column.null_count, ref.label
    assert told > 700


def test_what_the_footer_cannot_vouch_for(tmp_path: Path) -> None:
    def written(name: str, values: list, **options) -> Path:
        path = tmp_path / f"{name}_perf.parquet"
        pq.write_table(pa.table({"version": pa.array(values, pa.string()), "x": list(range(len(values)))}), path,
                       **options)
        return path

    assert constant_value(written("one", ["2.29.2"] * 10, row_group_size=3), "version") == "2.29.2"
    assert constant_value(written("two", ["2.29.2"] * 5 + ["2.27"] * 5, row_group_size=5), "version") is None
    assert constant_value(written("nulls", ["2.29.2", None, "2.29.2"]), "version") is None
    assert constant_value(written("no_stats", ["2.29.2"] * 4, write_statistics=False), "version") is None
    assert constant_value(written("long", ["9" * 80] * 4), "version") is None
    assert constant_value(written("one", ["2.29.2"] * 10), "no_such_column") is None
    whole = written("cut", ["2.29.2"] * 10)
    assert file_metadata(whole) is not None
    cut = tmp_path / "cut2_perf.parquet"
    cut.write_bytes(whole.read_bytes()[:-20] + whole.read_bytes()[-8:])  # a footer whose bytes are gone
    assert constant_value(cut, "version") is None
    csv = tmp_path / "nccl_perf.txt"
    csv.write_text("version,latency\n2.29.2,0.1\n")
    assert file_metadata(csv) is None and constant_value(csv, "version") is None
