"""The narrow read (``validate.read_narrow``: a table read row group by row group into narrow
preallocated arrays) against the whole read it replaces for big tables: the same validated
columns (values, dictionary order, codes), the same keyed table, the same failures, on every
table of the corpus and the fixtures it applies to and on real tables rewritten in many row
groups. ``NARROW_ROWS`` is set to 0 so that every table takes the narrow read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from modperf import errors as E
from modperf.data import validate
from modperf.data.buckets import KeyedTable, build_buckets
from modperf.data.catalog import Catalog, TableRef, refs_for_paths
from modperf.data.families import family_of
from modperf.data.reader import read_table
from modperf.data.validate import ValidatedTable, read_narrow, validate_table
from modperf.specs.models import ModelRegistry

DSA_CONTEXT = ("h200_sxm", "sglang", "0.5.14", "dsa_context_module")  # 81,836 rows, 5 models, stale guard


@pytest.fixture(autouse=True)
def narrow_everything(monkeypatch):
    monkeypatch.setattr(validate, "NARROW_ROWS", 0)


def _failure(f: E.ModperfError) -> tuple:
    return (type(f), str(f), f.file, f.rows, f.row_count, repr(f.values), f.fix)


def _same_validated(a: ValidatedTable, b: ValidatedTable) -> None:
    assert (a.n_rows, a.stored_rows, a.recorded_versions, a.missing_optional) == \
        (b.n_rows, b.stored_rows, b.recorded_versions, b.missing_optional)
    assert list(a.categorical) == list(b.categorical)
    for name in a.categorical:
        assert a.categorical[name].values == b.categorical[name].values, name
        assert np.array_equal(a.categorical[name].codes, b.categorical[name].codes), name
    assert list(a.integers) == list(b.integers)
    for name in a.integers:
        assert np.array_equal(a.integers[name], b.integers[name]), name
    assert a.latency.dtype == b.latency.dtype == np.float64 and a.latency.tobytes() == b.latency.tobytes()
    assert (a.model is None) == (b.model is None)
    if a.model is not None and b.model is not None:
        assert a.model.values == b.model.values and np.array_equal(a.model.codes, b.model.codes)
    assert (a.native is None) == (b.native is None)
    if a.native is not None:
        assert np.array_equal(a.native, b.native)
    assert a.geometry == b.geometry and list(a.configs) == list(b.configs)


def _same_keyed(a: KeyedTable, b: KeyedTable) -> None:
    for name in ("key_names", "bucket_keys", "bucket_models", "model_native", "model_geometry", "rows_read",
                 "duplicates_merged", "alias_duplicate_points", "natives_seen", "recorded_versions",
                 "rows_stored", "agreement", "missing_optional"):
        assert getattr(a, name) == getattr(b, name), name
    for name in ("offsets", "latency", "sources", "bucket_native", "bucket_local"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), name
    assert list(a.axes) == list(b.axes)
    for name in a.axes:
        assert a.axes[name].dtype == b.axes[name].dtype and a.axes[name].tobytes() == b.axes[name].tobytes()
    assert (a.duplicate_spread is None) == (b.duplicate_spread is None)
    if a.duplicate_spread is not None and b.duplicate_spread is not None:
        assert a.duplicate_spread.tobytes() == b.duplicate_spread.tobytes()
    assert a.bucket_columns is not None and b.bucket_columns is not None
    assert a.bucket_columns.values == b.bucket_columns.values
    for name, codes in a.bucket_columns.codes.items():
        assert codes.dtype == b.bucket_columns.codes[name].dtype
        assert np.array_equal(codes, b.bucket_columns.codes[name])


def _compare(ref: TableRef, registry: ModelRegistry) -> bool:
    """Validate ``ref`` both ways and assert the same outcome; whether the narrow read took it."""
    family = family_of(ref.table)
    assert family is not None
    narrow = read_narrow(ref, family) is not None
    new, new_failures = validate_table(ref, family, registry)
    try:
        whole = read_table(ref.path)
    except E.UnreadableTableError as exc:
        old, old_failures = None, [exc]
    else:
        old, old_failures = validate_table(ref, family, registry, whole)
    assert [_failure(f) for f in new_failures] == [_failure(f) for f in old_failures], ref.path
    assert (new is None) == (old is None)
    if new is not None and old is not None:
        _same_validated(new, old)
        _same_keyed(build_buckets(new), build_buckets(old))
    return narrow


def test_every_corpus_table_the_narrow_read_takes_validates_and_keys_as_the_whole_read(models):
    refs = [r for r in Catalog.scan(None).select(physical=True) if family_of(r.table) is not None]
    taken = [r for r in refs if validate._narrow_wanted(family_of(r.table).spec(r.table), r)]
    assert len(taken) > 300  # every family without declared guards, unpivot or derived columns
    assert all(_compare(ref, models) for ref in taken)


def test_every_fixture_table_validates_as_the_whole_read(fixtures, fixture_models):
    refs = [r for r in refs_for_paths([fixtures]) if family_of(r.table) is not None]
    narrow = [_compare(ref, fixture_models) for ref in refs]
    assert sum(narrow) >= 20  # most fixtures, the failing ones among them (stale, aliases, legacy)


def _rewrite(db, tmp_path: Path, mutate, *, row_group_size: int = 10_000, statistics: bool = True,
             name: str = "t") -> TableRef:
    """DSA_CONTEXT's rows, mutated, written in row groups of ``row_group_size`` rows."""
    ref = db.ref(*DSA_CONTEXT)
    table = mutate(pq.read_table(ref.path))
    out = tmp_path / name / ref.system / ref.family_dir / ref.backend / ref.version / ref.path.name
    out.parent.mkdir(parents=True)
    pq.write_table(table, out, row_group_size=row_group_size, write_statistics=statistics)
    return refs_for_paths([out])[0]


def _reordered(table: pa.Table) -> pa.Table:
    """Rows reordered (each row group meets the strings in another order, some not all of
    them), batch sizes of the last rows past uint16 (a later row group widens its column)."""
    order = np.lexsort((np.arange(table.num_rows) % 7, table["kernel_source"].to_numpy(zero_copy_only=False)))
    table = table.take(pa.array(order[::-1].copy()))
    batch = table["batch_size"].to_numpy().copy()
    batch[-5000:] += 70_000
    return table.set_column(table.schema.get_field_index("batch_size"), "batch_size", pa.array(batch))


@pytest.mark.parametrize("statistics", [True, False])
def test_many_row_groups_with_other_dictionaries_and_a_wider_last_group(db, models, tmp_path, statistics):
    ref = _rewrite(db, tmp_path, _reordered, statistics=statistics)
    meta = pq.read_metadata(ref.path)
    assert meta.num_row_groups == 9
    # the row groups' dictionaries differ (the whole read unifies them)
    kernels = [pq.ParquetFile(ref.path).read_row_group(g, columns=["kernel_source"]).column(0).unique().to_pylist()
               for g in (0, meta.num_row_groups - 1)]
    assert kernels[0] != kernels[1]
    family = family_of(ref.table)
    assert family is not None
    narrow = read_narrow(ref, family)
    assert narrow is not None
    assert narrow.integers["batch_size"].dtype == np.int32  # widened at the last row groups
    assert narrow.integers["tp_size"].dtype == np.int8
    assert narrow.integers["num_heads"].dtype == np.uint8  # 128 heads: unsigned where that is narrower
    assert all(c.codes.dtype == np.int8 for c in narrow.categorical.values())
    assert _compare(ref, models)


def _whole_read_failures(ref, models) -> list:
    """The failures of a table the narrow read declines: read whole, as before (its report
    the same whichever way validate_table is reached)."""
    family = family_of(ref.table)
    assert family is not None and read_narrow(ref, family) is None
    assert not _compare(ref, models)
    _, failures = validate_table(ref, family, models)
    return failures


def test_a_null_in_a_later_row_group_is_reported_by_the_whole_read(db, models, tmp_path):
    def with_null(table: pa.Table) -> pa.Table:
        heads = table["num_heads"].to_pylist()
        heads[50_000] = None
        return table.set_column(table.schema.get_field_index("num_heads"), "num_heads", pa.array(heads, pa.int64()))

    ref = _rewrite(db, tmp_path, with_null)
    failures = _whole_read_failures(ref, models)
    assert [(type(f), f.rows) for f in failures] == [(E.NullValueError, [50_000])]


def test_a_float_key_column_is_reported_by_the_whole_read(db, models, tmp_path):
    def float_isl(table: pa.Table) -> pa.Table:
        return table.set_column(table.schema.get_field_index("isl"), "isl", pc.cast(table["isl"], pa.float64()))

    ref = _rewrite(db, tmp_path, float_isl)
    failures = _whole_read_failures(ref, models)
    assert [type(f) for f in failures] == [E.ColumnTypeError]


def test_a_damaged_column_the_checks_never_read_fails_the_table_as_before(db, models, tmp_path):
    ref = _rewrite(db, tmp_path, lambda t: t)
    meta = pq.read_metadata(ref.path)
    chunk = meta.row_group(4).column(meta.schema.to_arrow_schema().get_field_index("device"))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(ref.path.read_bytes())
    for at in range(start + 20, start + chunk.total_compressed_size):
        data[at] ^= 0x5A
    ref.path.write_bytes(bytes(data))
    failures = _whole_read_failures(ref, models)
    assert [type(f) for f in failures] == [E.UnreadableTableError]


def test_a_table_below_narrow_rows_is_read_whole(db, models, monkeypatch):
    ref = db.ref(*DSA_CONTEXT)
    monkeypatch.setattr(validate, "NARROW_ROWS", pq.read_metadata(ref.path).num_rows + 1)
    family = family_of(ref.table)
    assert family is not None
    validated, _ = validate_table(ref, family, models)
    assert validated is not None and validated.integers["tp_size"].dtype == np.int64  # the whole read's types
    monkeypatch.setattr(validate, "NARROW_ROWS", 0)
    narrow, _ = validate_table(ref, family, models)
    assert narrow is not None and narrow.integers["tp_size"].dtype == np.int8
    _same_validated(narrow, validated)


def _stale_chains_by_sorting(spec, categorical, integers, n: int) -> np.ndarray:
    """stale_chain_rows's rule computed the plain way: chains by np.unique over the stacked key
    columns, then per chain the distinct tp sizes, head counts and products as Python sets."""
    heads, tp = integers["num_heads"].astype(np.int64), integers["tp_size"].astype(np.int64)
    columns = [categorical[c].codes.astype(np.int64) for c in spec.categorical if c in categorical]
    columns += [integers[c].astype(np.int64) for c in (*spec.discrete, *spec.axes)
                if c in integers and c not in ("num_heads", "tp_size")]
    _, chain = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)
    chain = chain.reshape(-1)
    stale = np.zeros(n, dtype=bool)
    for c in np.unique(chain):
        rows = chain == c
        pairs = set(zip(heads[rows].tolist(), tp[rows].tolist()))
        tps, heads_n, products = {t for _, t in pairs}, {h for h, _ in pairs}, {h * t for h, t in pairs}
        stale[rows] = len(tps) >= 2 and len(products) > len(heads_n)
    return stale


def test_stale_chain_rows_matches_the_rule_computed_by_sorting(db, tmp_path):
    ref = db.ref("h200_sxm", "trtllm", "1.3.0rc20", "generation_mla")  # local-only, tp chains
    family = family_of(ref.table)
    assert family is not None
    # the same rows stored the retired way (num_heads = heads x tp): every chain over tp stale
    table = pq.read_table(ref.path)
    table = table.set_column(table.schema.get_field_index("num_heads"), "num_heads",
                             pc.multiply(table["num_heads"], table["tp_size"]))
    out = tmp_path / ref.system / ref.family_dir / ref.backend / ref.version / ref.path.name
    out.parent.mkdir(parents=True)
    pq.write_table(table, out)
    for r, stale in ((ref, False), (refs_for_paths([out])[0], True)):
        typed = read_narrow(r, family)  # the narrow types (int8 codes, int16 heads) the loader hands it
        assert typed is not None
        got = validate.stale_chain_rows(family.spec(r.table), typed.categorical, typed.integers, typed.rows)
        assert got.any() == stale
        assert np.array_equal(got, _stale_chains_by_sorting(family.spec(r.table), typed.categorical,
                                                            typed.integers, typed.rows))
