"""Keying: buckets, the duplicate rule, aliases, and natives that never mix."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from modperf.data.catalog import refs_for_paths
from modperf.data.codes import combine, dense_levels, factorize, unique_codes
from modperf.data.loader import load_table


def raw_rows(path: Path, columns: list[str]) -> dict[str, np.ndarray]:
    t = pq.read_table(path, columns=columns)
    return {c: np.array(t.column(c).to_pylist()) for c in columns}


def test_codes_helpers():
    uniq, codes = factorize(np.array([7, 3, 7, 1048575, 3]))
    assert uniq.tolist() == [3, 7, 1048575] and codes.tolist() == [1, 0, 1, 2, 0]
    assert unique_codes(np.array([5, 1, 5, 2])).tolist() == [1, 2, 5]
    assert combine([np.array([0, 1]), np.array([2, 0])], [2, 3], 2).tolist() == [2, 3]


@pytest.mark.parametrize("values", [
    np.array([5, 3, 5, -2]), np.array([-128, 127, 0], dtype=np.int8), np.array([0, 255, 7], dtype=np.uint8),
    np.array([2**63 - 1, 2**63 - 3], dtype=np.int64), np.array([-(2**63), -(2**63) + 5]),
    np.array([2**64 - 1, 2**64 - 4], dtype=np.uint64), np.array([-(2**31), 2**31 - 2]),
    np.array([0, 1 << 14, 3]), np.array([0, (1 << 14) + 1, 3]), np.array([0, 2**40, 2**40, 9]),
    np.random.default_rng(0).integers(-1000, 1000, 20_000), np.array([7])])
def test_factorize_is_sorted_unique_with_inverse(values):
    """Short spans go through a presence table, long ones through a hash: both are numpy's
    sorted unique values and inverse, in the input's type."""
    uniq, codes = factorize(values)
    want_uniq, want_codes = np.unique(values, return_inverse=True)
    assert uniq.dtype == values.dtype and codes.dtype == np.int64
    assert uniq.tolist() == want_uniq.tolist() and codes.tolist() == want_codes.reshape(-1).tolist()
    low, span = int(values.min()), int(values.max()) - int(values.min()) + 1
    if span < 2**31 and span <= max(values.size, 1 << 14):  # keying's presence-table ranks, with their values
        levels, ranks = dense_levels(values, low, span)
        assert levels.dtype == values.dtype and levels.tolist() == want_uniq.tolist()
        assert ranks.tolist() == want_codes.reshape(-1).tolist()


def test_duplicate_rule_is_the_lower_median(db):
    """b300 sglang 0.5.14 measured parts of its DSV4 CSA context grid up to six times."""
    keyed = db.table("b300_sxm", "sglang", "0.5.14", "dsv4_csa_context_module")
    assert keyed.rows_read == 89_689 and keyed.duplicates_merged == 44_240 and keyed.alias_duplicate_points == 0
    cols = ["op_name", "kernel_source", "model", "mla_dtype", "kv_cache_dtype", "gemm_type", "num_heads", "batch_size",
            "isl", "tp_size", "step", "compress_ratio", "latency"]
    raw = raw_rows(keyed.ref.path, cols)
    groups: dict[tuple, list[float]] = defaultdict(list)
    for i in range(raw["latency"].size):
        groups[tuple(raw[c][i] for c in cols[:-1])].append(float(raw["latency"][i]))
    sizes = {len(v) for v in groups.values()}
    assert sizes == {1, 2, 3, 6}
    checked = 0
    for key, values in groups.items():
        if len(values) < 2 or checked >= 200:
            continue
        native = {"sgl-project/DeepSeek-V4-Flash-FP8": 64, "deepseek-ai/DeepSeek-V4-Pro": 128}[key[2]]
        bucket = keyed.bucket_id((*key[:2], *key[3:6], key[11], native, key[6]))
        lo, hi = keyed.offsets[bucket], keyed.offsets[bucket + 1]
        ax = keyed.axes
        at = np.flatnonzero((ax["batch_size"][lo:hi] == key[7]) & (ax["isl"][lo:hi] == key[8])
                            & (ax["step"][lo:hi] == key[10]))
        assert at.size == 1
        expected = sorted(values)[(len(values) - 1) // 2]  # lower median: a measured value
        assert keyed.latency[lo + at[0]] == expected
        assert keyed.sources[lo + at[0]] == len(values)
        checked += 1
    assert checked == 200


def test_gb300_mla_module_keeps_kimi_k3_and_deepseek_v3_apart(db):
    keyed = db.table("gb300", "vllm", "0.27.0", "mla_context_module")
    assert keyed.key_names == ("op_name", "kernel_source", "mla_dtype", "kv_cache_dtype", "gemm_type", "native",
                               "num_heads")
    assert keyed.natives == [96, 128]
    by_native: dict[int, set[str]] = defaultdict(set)
    for b in range(keyed.n_buckets):
        (model,) = keyed.bucket_models[b]  # one model per bucket: the natives never mix
        by_native[int(keyed.bucket_native[b])].add(model)
        assert keyed.model_native[model] == keyed.bucket_native[b]
    assert by_native == {96: {"moonshotai/Kimi-K3"}, 128: {"deepseek-ai/DeepSeek-V3"}}
    # 8684 DeepSeek-V3 keys share their local key with Kimi-K3 keys, yet every point survives
    assert keyed.rows_read == keyed.n_points == 21_860
    locals_96 = sorted({int(l) for l, n in zip(keyed.bucket_local, keyed.bucket_native) if n == 96})
    assert locals_96 == [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128]


def test_aliases_share_a_bucket(fixtures: Path):
    from modperf.specs.models import ModelRegistry

    path = fixtures / "02_alias_duplication/githead_095f58a51/h200_sxm/mla/vllm/0.22.0/mla_context_module_perf.parquet"
    keyed = load_table(refs_for_paths([path])[0], ModelRegistry.default())
    assert keyed.rows_read == 11_658 and keyed.n_points == 3_886
    assert keyed.duplicates_merged == 7_772 and keyed.alias_duplicate_points == 3_886
    assert set(keyed.bucket_models) == {("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3",
                                         "nvidia/DeepSeek-V3.1-NVFP4")}
    assert keyed.natives == [128]


def test_dsa_aliases_and_natives(fixtures: Path):
    from modperf.specs.models import ModelRegistry

    path = fixtures / "02_alias_duplication/githead_095f58a51/h200_sxm/sparse_attention/vllm/0.22.0/dsa_generation_module_perf.parquet"
    keyed = load_table(refs_for_paths([path])[0], ModelRegistry.default())
    models_by_native = defaultdict(set)
    for b in range(keyed.n_buckets):
        models_by_native[int(keyed.bucket_native[b])].update(keyed.bucket_models[b])
    assert models_by_native == {128: {"deepseek-ai/DeepSeek-V3.2"},
                                64: {"nvidia/GLM-5-NVFP4", "zai-org/GLM-5", "zai-org/GLM-5-FP8"}}
    assert keyed.rows_read == 23_552 and keyed.n_points == 11_776


@pytest.mark.parametrize(("system", "median"), [("h100_sxm", 0.0085), ("h200_sxm", 0.5465)])
def test_glm5_glm52_dense_mha_rows_are_kept_apart_by_op_name(db, system, median):
    """GLM-5 and GLM-5.2 share the native-64 DSA geometry (aliases), and their rows stay apart
    because op_name (indexer vs skip-indexer layers) is a key column. At identical keys otherwise,
    their dense-MHA rows agree on h100 and differ by 55% on h200: a measurement disagreement
    for the quality audit, not a geometry difference."""
    keyed = db.table(system, "sglang", "0.5.14", "dsa_context_module")
    ops_by_model = defaultdict(set)
    for b in range(keyed.n_buckets):
        for m in keyed.bucket_models[b]:
            ops_by_model[m].add(keyed.bucket_keys[b][0])
    assert ops_by_model["zai-org/GLM-5"] == {"dsa_context_module"}
    assert ops_by_model["zai-org/GLM-5.2"] == {"dsa_context_module_skip_indexer"}
    ratios = []
    for b in range(keyed.n_buckets):
        key = dict(zip(keyed.key_names, keyed.bucket_keys[b]))
        if keyed.bucket_models[b] != ("zai-org/GLM-5",) or key["kernel_source"] != "sglang_dsa_dense_mha_fa3":
            continue
        twin = keyed.bucket_id(tuple({**key, "op_name": "dsa_context_module_skip_indexer"}.values()))
        assert keyed.bucket_models[twin] == ("zai-org/GLM-5.2",)
        a, c = slice(keyed.offsets[b], keyed.offsets[b + 1]), slice(keyed.offsets[twin], keyed.offsets[twin + 1])
        mine = {k: v for k, v in zip(zip(*(keyed.axes[x][a] for x in keyed.spec.axes)), keyed.latency[a])}
        theirs = {k: v for k, v in zip(zip(*(keyed.axes[x][c] for x in keyed.spec.axes)), keyed.latency[c])}
        ratios += [theirs[k] / mine[k] - 1 for k in mine.keys() & theirs.keys()]
    assert np.median(ratios) == pytest.approx(median, abs=5e-4)


def test_narrowest_types_hold_every_value_exactly():
    from modperf.data.buckets import _count_type
    from modperf.data.codes import narrowest_int, narrowest_signed

    for values, dtype in (([0, 127], np.int8), ([-128, 5], np.int8), ([0, 128], np.int16), ([-129], np.int16),
                          ([32767], np.int16), ([32768], np.int32), ([2**31 - 1, -(2**31)], np.int32),
                          ([2**31], np.int64), ([-(2**31) - 1], np.int64), ([2**62], np.int64)):
        out = np.array(values, dtype=np.int64).astype(narrowest_signed(min(values), max(values)))
        assert out.dtype == dtype and out.tolist() == values, values
    for values, dtype in (([0, 255], np.uint8), ([-1, 127], np.int8), ([-1, 255], np.int16), ([0, 60_000], np.uint16),
                          ([-1, 60_000], np.int32), ([0, 2**32 - 1], np.uint32), ([-1, 2**32 - 1], np.int64)):
        out = np.array(values, dtype=np.int64).astype(narrowest_int(min(values), max(values)))
        assert out.dtype == dtype and out.tolist() == values, values
    for top, dtype in ((1, np.uint8), (255, np.uint8), (256, np.uint16), (65535, np.uint16), (65536, np.uint32),
                       (2**32 - 1, np.uint32), (2**32, np.uint64)):
        out = _count_type(np.array([1, top], dtype=np.int64))
        assert out.dtype == dtype and out.tolist() == [1, top], top


def test_keyed_axes_and_counts_are_stored_narrow(db):
    """The b300 DSV4 CSA context table: axes in the narrowest type of their values, the rows
    merged into a point (1, 2, 3 or 6) as uint8; the values are the file's."""
    from modperf.data.codes import narrowest_signed

    keyed = db.table("b300_sxm", "sglang", "0.5.14", "dsv4_csa_context_module")
    raw = raw_rows(keyed.ref.path, list(keyed.spec.axes))
    for axis in keyed.spec.axes:
        values = keyed.axes[axis]
        column = raw[axis].astype(np.int64)
        assert values.dtype == narrowest_signed(int(column.min()), int(column.max())), axis
        assert values.dtype.itemsize < 8, axis
        assert set(values.tolist()) == set(raw[axis].tolist()), axis
    assert keyed.sources.dtype == np.uint8 and sorted(set(keyed.sources.tolist())) == [1, 2, 3, 6]
    assert int(keyed.sources.sum()) == keyed.rows_read


def test_a_point_merging_300_rows_counts_them_in_uint16(db, tmp_path):
    """One nccl row repeated 300 times: its point counts 300 rows (past uint8), exactly."""
    import pyarrow as pa
    from tests.helpers import variant

    from modperf.specs.models import ModelRegistry

    def repeat_first(table: pa.Table) -> pa.Table:
        return pa.concat_tables([table] + [table.slice(0, 1)] * 299)

    ref = variant(db, tmp_path, ("a100_sxm", "nccl", "2.27.3", "nccl"), repeat_first)
    keyed = load_table(ref, ModelRegistry.default())
    assert keyed.sources.dtype == np.uint16
    assert sorted(set(keyed.sources.tolist())) == [1, 300] and int(keyed.sources.sum()) == keyed.rows_read == 504 + 299
    assert keyed.duplicates_merged == 299 and keyed.n_points == 504


def test_scaling_ratios_over_narrow_axes_equal_the_int64_ones(db):
    """message_size x 2 on int32-stored axes: the guard widens before multiplying, so its pairs
    and ratios are those of int64 axes."""
    import copy

    from modperf.data.families.base import Scaling
    from modperf.data.keyed_guards import scaling_ratios

    keyed = db.table("a100_sxm", "nccl", "2.27.3", "nccl")
    assert keyed.axes["message_size"].dtype == np.int32
    wide = copy.copy(keyed)
    wide.axes = {a: v.astype(np.int64) for a, v in keyed.axes.items()}
    guards = [g for g in keyed.spec.guards if isinstance(g, Scaling)]
    assert guards
    for guard in guards:
        narrow, widened = scaling_ratios(keyed, guard), scaling_ratios(wide, guard)
        assert narrow is not None and widened is not None and narrow.size >= guard.min_pairs
        assert np.array_equal(narrow, widened)


def _keyed_state(keyed) -> list:
    """Everything a keyed table holds that a query, the cache or check reads, arrays with their
    types."""
    def plain(v):  # bytes: a NaN spread equals itself
        return (str(v.dtype), v.shape, v.tobytes()) if isinstance(v, np.ndarray) else v
    cols = keyed.bucket_columns
    return [keyed.key_names, keyed.bucket_keys, plain(keyed.offsets), {a: plain(v) for a, v in keyed.axes.items()},
            plain(keyed.latency), plain(keyed.sources), keyed.bucket_models, plain(keyed.bucket_native),
            plain(keyed.bucket_local), keyed.rows_read, keyed.duplicates_merged, keyed.alias_duplicate_points,
            keyed.agreement, keyed.natives_seen,
            None if keyed.duplicate_spread is None else plain(keyed.duplicate_spread),
            {k: plain(v) for k, v in cols.codes.items()}, cols.values]


KEYED_BY_EVERY_CODING = [
    ("b300_sxm", "sglang", "0.5.14", "dsv4_csa_context_module"),  # keys measured up to six times
    ("rtx_pro_6000_server", "trtllm", "1.3.0rc10", "wideep_moe"),  # columns too wide for one code as they are
    ("b60", "vllm", "0.26.0", "moe"),
    ("a100_sxm", "trtllm", "1.0.0", "context_mla"),  # natives agreeing at a local key
    ("gb300", "vllm", "0.27.0", "mla_context_module"),  # the native keyed
]


@pytest.mark.parametrize(("code_bits", "radix_bits"), [(30, 62), (8, 62), (63, 8), (8, 8)])
def test_keying_is_the_same_whichever_way_the_key_is_coded(db, fixtures: Path, monkeypatch, code_bits, radix_bits):
    """The full key is one integer tagged with its row where both fit 63 bits (wide columns
    ranked until they do), else sorted by a stable argsort, else (digits past 62 bits) each
    row's rank among the distinct rows: real tables key the same every way, aliases included."""
    import dataclasses

    import modperf.data.buckets as buckets
    from modperf.data.loader import load_one

    alias = fixtures / "02_alias_duplication/githead_095f58a51/h200_sxm/mla/vllm/0.22.0/mla_context_module_perf.parquet"
    refs = [db.table(*slot).ref for slot in KEYED_BY_EVERY_CODING] + [refs_for_paths([alias])[0]]
    validated = [load_one(ref, db.queries.store.models, keep_validated=True).validated for ref in refs]
    expected = [_keyed_state(buckets.build_buckets(vt)) for vt in validated]
    monkeypatch.setattr(buckets, "_CODE_BITS", code_bits)
    monkeypatch.setattr(buckets, "_RADIX_BITS", radix_bits)
    for vt, want in zip(validated, expected):
        assert _keyed_state(buckets.build_buckets(vt)) == want, vt.ref.label
        taken = dataclasses.replace(vt)  # keying empties what it consumes: the original stays whole
        assert _keyed_state(buckets.build_buckets(taken, consume=True)) == want, vt.ref.label
        assert (taken.categorical, taken.integers, taken.native, taken.model, taken.latency.size) == ({}, {}, None,
                                                                                                    None, 0)
        assert vt.integers and vt.latency.size == vt.n_rows
    assert expected[-1][11] == 3_886  # the alias table's points measured under several names


@pytest.mark.parametrize("code_bits", [63, 30, 20])
def test_a_big_table_reads_its_points_back_from_the_key_code(db, fixtures: Path, monkeypatch, code_bits):
    """A big table keyed with ``consume`` drops its key and axis columns once they are in the
    key code and reads the points' axes and the buckets' keys back from the sorted code (every
    table counts as big here; with fewer code bits more columns are ranked, and read back
    through their ranks' values): the same keyed table as the gathers give, aliases included."""
    import dataclasses

    import modperf.data.buckets as buckets
    from modperf.data.loader import load_one

    alias = fixtures / "02_alias_duplication/githead_095f58a51/h200_sxm/mla/vllm/0.22.0/mla_context_module_perf.parquet"
    refs = [db.table(*slot).ref for slot in KEYED_BY_EVERY_CODING] + [refs_for_paths([alias])[0]]
    validated = [load_one(ref, db.queries.store.models, keep_validated=True).validated for ref in refs]
    expected = [_keyed_state(buckets.build_buckets(vt)) for vt in validated]
    read_back = buckets._read_back
    calls: list[int] = []

    def counted(*args, **kwargs):
        calls.append(1)
        return read_back(*args, **kwargs)

    monkeypatch.setattr(buckets, "_read_back", counted)
    monkeypatch.setattr(buckets, "_READ_BACK_ROWS", 1)
    monkeypatch.setattr(buckets, "_CODE_BITS", code_bits)
    ranked = 0
    for vt, want in zip(validated, expected):
        calls.clear()
        assert _keyed_state(buckets.build_buckets(dataclasses.replace(vt), consume=True)) == want, vt.ref.label
        assert len(calls) == 2, vt.ref.label  # the points' axes, the buckets' keys
        digits = [buckets._Digit.of_ints(vt.integers[a]) for a in vt.spec.axes]
        ranked += buckets._radix_total(digits) >= 1 << code_bits
    assert (ranked > 0) == (code_bits < 63)
    assert expected[-1][11] == 3_886


@pytest.mark.parametrize("chunk", [5, 64])
def test_keying_is_the_same_in_chunks_of_any_size(db, fixtures: Path, monkeypatch, chunk):
    """Keying works through a big table's rows a chunk at a time (tagging, neighbours, the
    duplicates' order by latency, the read-back, the latency gather, the natives' agreement):
    real tables with keys measured up to six times, aliases and natives sharing local keys key
    the same whatever the chunk, cut inside or between repeated keys."""
    import dataclasses

    import modperf.data.buckets as buckets
    from modperf.data.loader import load_one

    alias = fixtures / "02_alias_duplication/githead_095f58a51/h200_sxm/mla/vllm/0.22.0/mla_context_module_perf.parquet"
    refs = [db.table(*slot).ref for slot in KEYED_BY_EVERY_CODING] + [refs_for_paths([alias])[0]]
    validated = [load_one(ref, db.queries.store.models, keep_validated=True).validated for ref in refs]
    expected = [_keyed_state(buckets.build_buckets(vt)) for vt in validated]
    assert expected[0][10] == 44_240 and expected[-1][11] == 3_886  # duplicates merged; alias points
    assert expected[3][12].shared_keys == 1_044  # local keys measured by two natives (their agreement)
    monkeypatch.setattr(buckets, "_CHUNK", chunk)
    for read_back_rows in (1 << 40, 1):
        monkeypatch.setattr(buckets, "_READ_BACK_ROWS", read_back_rows)
        for vt, want in zip(validated, expected):
            assert _keyed_state(buckets.build_buckets(dataclasses.replace(vt), consume=True)) == want, vt.ref.label


def test_a_load_keeps_the_validated_table_only_when_asked(db):
    """Without ``keep_validated`` keying takes the validated columns over (they are dropped
    as keying goes); the keyed table is the same either way, and the audits' view is whole."""
    from modperf.data.loader import load_one

    for slot in KEYED_BY_EVERY_CODING:
        ref = db.table(*slot).ref
        plain, kept = load_one(ref, db.queries.store.models), load_one(ref, db.queries.store.models,
                                                                       keep_validated=True)
        assert plain.validated is None and plain.ok and kept.ok
        assert _keyed_state(plain.keyed) == _keyed_state(kept.keyed), slot
        vt = kept.validated
        assert vt is not None and vt.latency.size == vt.n_rows == plain.keyed.rows_read
        assert set(vt.integers) >= {*vt.spec.axes, *vt.spec.heads}


def test_scaling_pairs_by_binary_search_are_the_ranked_ones(db):
    """Stored points ascend in key order, so a step's partner is found by a binary search over
    (bucket, axis - min) codes; the ranked way (every value and stepped value factorized, codes
    sorted) pairs the same points in the same order."""
    from modperf.data.families.base import Scaling
    from modperf.data.keyed_guards import _bucket_targets, _point_bucket, _scaling_ratios_ranked, scaling_ratios

    checked = 0
    for slot in [("a100_sxm", "nccl", "2.27.3", "nccl"), ("h200_sxm", "sglang", "0.5.14", "moe"),
                 ("b300_sxm", "sglang", "0.5.14", "dsv4_csa_context_module")]:
        keyed = db.table(*slot)
        for guard in (g for g in keyed.spec.guards if isinstance(g, Scaling)):
            got = scaling_ratios(keyed, guard)
            if got is None:
                continue
            targets, point_bucket = _bucket_targets(keyed, guard), _point_bucket(keyed)
            base = (targets[point_bucket] >= 0) & (keyed.latency > 0)
            for c, low in guard.at_least.items():
                if c in keyed.axes:
                    base &= keyed.axes[c] >= low
            want = _scaling_ratios_ranked(keyed, guard, point_bucket, targets, np.flatnonzero(base))
            assert got.tobytes() == want.tobytes() and got.size, (slot, guard.name)
            checked += 1
    assert checked >= 2


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.uint64])
def test_keying_is_the_same_whatever_integer_type_validation_hands_it(db, dtype):
    """Validation hands keying int64 columns today; narrower or unsigned columns (a validated
    table that holds them narrow) key the same table, axes in the same narrow types."""
    import dataclasses

    from modperf.data.buckets import build_buckets
    from modperf.data.loader import load_one

    for slot in KEYED_BY_EVERY_CODING[:3]:
        vt = load_one(db.table(*slot).ref, db.queries.store.models, keep_validated=True).validated
        want = _keyed_state(build_buckets(vt))
        assert all(int(v.min()) >= 0 and int(v.max()) < 2**31 for v in vt.integers.values())
        narrow = dataclasses.replace(vt, integers={k: v.astype(dtype) for k, v in vt.integers.items()},
                                     native=None if vt.native is None else vt.native.astype(np.int64))
        assert _keyed_state(build_buckets(narrow)) == want, (slot, dtype)
