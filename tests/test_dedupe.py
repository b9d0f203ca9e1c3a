"""Alias de-duplication on real data: the vllm 0.22.0 alias fixtures, the embedded corpus, and
small synthetic tables for the fail-closed paths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from modperf import errors as E
from modperf.audit.dedupe import DEFAULT_TOLERANCE, audit_table, dedupe, write_table
from modperf.data.catalog import TableRef, refs_for_paths
from modperf.data.loader import load_one
from modperf.data.parquet_files import written_by_modperf
from modperf.fast.cache_keys import embedded_data_root
from modperf.specs.models import ModelRegistry

ALIAS = "02_alias_duplication"
V3, R1, NVFP4 = "deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1", "nvidia/DeepSeek-V3.1-NVFP4"
GLM5, GLM5_FP8, GLM5_NVFP4, V32 = "zai-org/GLM-5", "zai-org/GLM-5-FP8", "nvidia/GLM-5-NVFP4", "deepseek-ai/DeepSeek-V3.2"


@pytest.fixture(scope="module")
def alias_report(fixtures: Path):
    return dedupe([str(fixtures / ALIAS)])


def _file(report, table: str):
    (match,) = [f for f in report.files if f.ref.table == table]
    return match


def test_mla_context_alias_group_and_spread(alias_report) -> None:
    f = _file(alias_report, "mla_context_module")
    assert (f.rows, f.identities, f.duplicate_rows) == (11658, 3886, 7772)
    assert (f.alias_duplicate_rows, f.repeat_rows, f.alias_keys, f.repeat_keys) == (7772, 0, 3886, 0)
    (g,) = f.alias_groups
    assert g.native == 128 and g.models == [R1, V3, NVFP4]
    assert g.rows == {R1: 3886, V3: 3886, NVFP4: 3886} and g.shared_keys == 3886
    # all three measured every identity: the tie goes to the shorter id, then the alphabet
    assert g.canonical == R1
    assert g.spread.keys == 3886
    assert g.spread.median == pytest.approx(0.002567481732680732, rel=1e-12)
    assert g.spread.p95 == pytest.approx(0.062125650294231505, rel=1e-12)
    assert g.spread.max == pytest.approx(1.0730848666917008, rel=1e-12)
    assert g.spread.over_tolerance == 155 and f.over_tolerance_keys == 155
    # the widest spread: DeepSeek-V3 measured twice what its aliases measured
    worst = f.over_tolerance[0]
    assert worst.kind == "alias" and worst.rel_diff == pytest.approx(1.0730848666917008)
    assert worst.key == {"op_name": "mla_context_module", "kernel_source": "default", "mla_dtype": "bfloat16",
                         "kv_cache_dtype": "fp8", "gemm_type": "fp8_block", "native": 128, "num_heads": 128,
                         "batch_size": 256, "isl": 32, "step": 0}
    assert worst.latencies == {NVFP4: [6.3912], R1: [6.4087], V3: [13.2495]}


def test_mla_generation_alias_group_and_spread(alias_report) -> None:
    f = _file(alias_report, "mla_generation_module")
    assert (f.rows, f.identities, f.duplicate_rows) == (17656, 5888, 11768)
    (g,) = f.alias_groups
    assert g.rows == {R1: 5885, V3: 5886, NVFP4: 5885}
    assert g.canonical == V3  # measured the most identities
    assert g.shared_keys == 5886  # two identities were measured under one name only
    assert g.spread.median == pytest.approx(0.0049423393739703725, rel=1e-12)
    assert g.spread.p95 == pytest.approx(0.035898659261602184, rel=1e-12)
    assert g.spread.max == pytest.approx(0.5615914307574597, rel=1e-12)
    assert g.spread.over_tolerance == 60


def test_dsa_natives_stay_apart(alias_report) -> None:
    f = _file(alias_report, "dsa_generation_module")
    assert f.models == {V32: 128, GLM5_NVFP4: 64, GLM5: 64, GLM5_FP8: 64}
    # DeepSeek-V3.2 (128) is no alias of the GLM-5 names (64): one group, of three names
    (g,) = f.alias_groups
    assert g.native == 64 and g.models == [GLM5_NVFP4, GLM5, GLM5_FP8]
    assert g.canonical == GLM5  # three-way tie on identities and rows: shortest id
    assert (f.identities, f.duplicate_rows, g.shared_keys) == (11776, 11776, 5888)
    assert g.spread.median == pytest.approx(0.0042495233032698865, rel=1e-12)
    assert g.spread.p95 == pytest.approx(0.01554404145077718, rel=1e-12)
    assert g.spread.max == pytest.approx(0.07076663858466725, rel=1e-12)
    assert g.spread.over_tolerance == 0
    assert g.geometry["num_attention_heads"] == 64 and g.geometry["index_topk"] == 2048


def test_tolerance_is_an_option(fixtures: Path) -> None:
    assert DEFAULT_TOLERANCE == 0.10
    tight = dedupe([str(fixtures / ALIAS)], tolerance=0.05)
    loose = dedupe([str(fixtures / ALIAS)], tolerance=0.20)
    assert [f.alias_groups[0].spread.over_tolerance for f in tight.files] == [212, 213, 20]
    assert [f.alias_groups[0].spread.over_tolerance for f in loose.files] == [85, 33, 0]
    with pytest.raises(E.OptionValueError):
        dedupe([str(fixtures / ALIAS)], tolerance=-0.1)
    # listed identities: the widest 10 by default, every one with examples=0
    assert [len(f.over_tolerance) for f in dedupe([str(fixtures / ALIAS)]).files] == [10, 10, 0]
    assert [len(f.over_tolerance) for f in dedupe([str(fixtures / ALIAS)], examples=0).files] == [155, 60, 0]


def test_prefer_overrides_the_canonical_rule(fixtures: Path) -> None:
    report = dedupe([str(fixtures / ALIAS)], prefer=[V3, GLM5_FP8])
    assert [f.alias_groups[0].canonical for f in report.files] == [V3, V3, GLM5_FP8]


def test_write_keeps_every_answer(fixtures: Path, tmp_path: Path) -> None:
    out = tmp_path / "deduped"
    report = dedupe([str(fixtures / ALIAS)], write=out, prefer=[V3])
    assert report.ok and all(f.written and f.written.verified for f in report.files)
    src = refs_for_paths([fixtures / ALIAS])
    dst = refs_for_paths([out])
    assert sorted(r.table for r in dst) == ["dsa_generation_module", "mla_context_module", "mla_generation_module"]
    registry = ModelRegistry.default()
    for before_ref in src:
        (after_ref,) = [r for r in dst if r.table == before_ref.table]
        before, after = load_one(before_ref, registry), load_one(after_ref, registry)
        assert after.failures == [] and after.keyed is not None and before.keyed is not None
        # the same buckets, points and latencies, bit for bit: queries answer identically
        assert after.keyed.bucket_keys == before.keyed.bucket_keys
        assert np.array_equal(after.keyed.offsets, before.keyed.offsets)
        assert np.array_equal(after.keyed.latency, before.keyed.latency)
        for axis in before.keyed.axes:
            assert np.array_equal(after.keyed.axes[axis], before.keyed.axes[axis])
        # one row per identity now
        assert after.keyed.duplicates_merged == 0
        assert after.keyed.rows_read == _file(report, before_ref.table).identities
    table = pq.read_table(out / "h200_sxm/mla/vllm/0.22.0/mla_context_module_perf.parquet")
    assert set(table.column("model").to_pylist()) == {V3}
    assert table.column("measured_by").type == pa.list_(pa.string())
    assert {tuple(x) for x in table.column("measured_by").to_pylist()} == {(R1, V3, NVFP4)}
    assert set(table.column("architecture").to_pylist()) == {"DeepseekV3ForCausalLM"}
    # the kept row carries its own power reading, not another alias's
    assert "power" in table.column_names
    dsa = pq.read_table(out / "h200_sxm/sparse_attention/vllm/0.22.0/dsa_generation_module_perf.parquet")
    assert dict(zip(*np.unique(dsa.column("model").to_numpy(zero_copy_only=False), return_counts=True))) == {
        V32: 5888, GLM5: 5888}
    glm_rows = dsa.filter(pa.compute.equal(dsa.column("model"), GLM5))
    assert {tuple(x) for x in glm_rows.column("measured_by").to_pylist()} == {(GLM5_NVFP4, GLM5, GLM5_FP8)}
    # a de-duplicated table de-duplicates to itself
    again = dedupe([str(out)])
    assert again.totals()["duplicate_rows"] == 0 and again.totals()["files_with_aliases"] == 0


def test_kept_latency_is_the_lower_median(fixtures: Path, tmp_path: Path) -> None:
    dedupe([str(fixtures / ALIAS / "githead_095f58a51/h200_sxm/mla")], write=tmp_path, table="mla_context_module")
    table = pq.read_table(tmp_path / "h200_sxm/mla/vllm/0.22.0/mla_context_module_perf.parquet")
    row = table.filter(pa.compute.and_(pa.compute.equal(table.column("batch_size"), 256),
                                       pa.compute.and_(pa.compute.equal(table.column("isl"), 32),
                                                       pa.compute.and_(pa.compute.equal(table.column("num_heads"), 128),
                                                                       pa.compute.equal(table.column("kv_cache_dtype"),
                                                                                        "fp8")))))
    row = row.filter(pa.compute.equal(row.column("gemm_type"), "fp8_block"))
    # 6.3912, 6.4087, 13.2495 -> the lower median, 6.4087 (DeepSeek-R1's row, R1 canonical by default)
    assert row.column("latency").to_pylist() == [6.4087]
    assert row.column("model").to_pylist() == [R1]


def test_write_a_corpus_table_written_twice(tmp_path: Path) -> None:
    # sglang 0.5.14 mla_bmm holds every row twice; dropping the first copy of a row changes the
    # order in which categorical values first appear, hence bucket order, never the answers
    source = embedded_data_root() / "h100_sxm/mla_bmm/sglang/0.5.14/mla_bmm_perf.parquet"
    report = dedupe([str(source)], write=tmp_path)
    (f,) = report.files
    assert (f.rows, f.identities, f.repeat_rows) == (1696, 848, 848)
    assert f.written is not None and f.written.verified and f.written.rows_written == 848


def test_write_refuses_to_touch_sources(fixtures: Path, tmp_path: Path) -> None:
    with pytest.raises(E.DedupeOutputError, match="inside the data root"):
        dedupe(data_root=str(embedded_data_root()), table="mla_bmm",
               write=embedded_data_root() / "deduped")
    # OUT_DIR equal to the folder the file sits in, under the same layout: the source itself
    layout_root = tmp_path / "root"
    folder = layout_root / "h200_sxm" / "mla" / "vllm" / "0.22.0"
    folder.mkdir(parents=True)
    src = fixtures / ALIAS / "githead_095f58a51/h200_sxm/mla/vllm/0.22.0/mla_context_module_perf.parquet"
    (folder / src.name).write_bytes(src.read_bytes())
    with pytest.raises(E.DedupeOutputError, match="overwrite a source"):
        dedupe([str(folder / src.name)], write=layout_root)


def _kernel_table(path: Path, rows: list[tuple[int, int, float]]) -> TableRef:
    """A small context_mla (local-only MLA kernel) table: (num_heads, tp_size, latency) at one key."""
    n = len(rows)
    table = pa.table({
        "op_name": ["mla_context"] * n, "kernel_source": ["default"] * n, "mla_dtype": ["bfloat16"] * n,
        "kv_cache_dtype": ["bfloat16"] * n, "num_heads": [r[0] for r in rows], "batch_size": [1] * n,
        "isl": [1024] * n, "tp_size": [r[1] for r in rows], "step": [0] * n, "latency": [r[2] for r in rows],
    })
    pq.write_table(table, path)
    return TableRef("context_mla", path, "h200_sxm", "mla", "sglang", "0.0.1")


def test_verification_fails_closed(tmp_path: Path) -> None:
    # local 32 is measured by the 64-native chain (32 x tp2, twice) and the 128-native chain
    # (32 x tp4, once). The loader merges all three (lower median 2.0); de-duplicating per
    # native keeps 1.0 and 3.0, whose lower median is 1.0: the answer would change, so nothing
    # is written.
    registry = ModelRegistry.default()
    ref = _kernel_table(tmp_path / "context_mla_perf.parquet",
                        [(32, 2, 1.0), (32, 2, 2.0), (32, 4, 3.0), (64, 1, 4.0), (128, 1, 5.0)])
    loaded = load_one(ref, registry, keep_arrow=True, keep_validated=True)
    assert loaded.failures == []
    audit = audit_table(loaded, keep_for_write=True)
    assert (audit.identities, audit.duplicate_rows, audit.repeat_rows) == (4, 1, 1)
    dest = tmp_path / "out" / "context_mla_perf.parquet"
    result = write_table(loaded, audit, dest, registry)
    assert not result.verified and not dest.exists()
    (failure,) = result.failures
    assert isinstance(failure, E.DedupeVerifyError)
    assert failure.values["what"] == "latency" and failure.values["before"] == 2.0 and failure.values["after"] == 1.0
    assert not list(dest.parent.glob(".*tmp"))  # no temporary file left behind


def test_repeats_without_a_model_column(tmp_path: Path) -> None:
    ref = _kernel_table(tmp_path / "context_mla_perf.parquet",
                        [(32, 2, 1.0), (32, 2, 1.5), (32, 2, 1.02), (64, 1, 4.0), (16, 4, 0.5)])
    audit = audit_table(load_one(ref, ModelRegistry.default(), keep_validated=True))
    assert audit.alias_groups == [] and audit.alias_duplicate_rows == 0
    assert (audit.repeat_rows, audit.repeat_keys) == (2, 1)
    assert audit.repeat_spread.max == pytest.approx(0.5)
    (o,) = audit.over_tolerance
    assert o.kind == "repeat" and o.latencies == {"": [1.0, 1.02, 1.5]}


def test_a_table_that_fails_to_load_is_reported(fixtures: Path) -> None:
    report = dedupe([str(fixtures / "03_legacy_no_num_heads")])
    assert not report.ok
    assert {type(f) for f in report.failures} == {E.MissingColumnError}
    assert all(f.rows == 0 and f.identities == 0 for f in report.files)


@pytest.mark.slow
def test_embedded_corpus_has_no_alias_duplicates() -> None:
    report = dedupe()
    t = report.totals()
    assert report.ok and t["files"] == 363 and t["rows"] == 5464709
    # the wheel's duplicates are all repeats under one name
    assert t["alias_duplicate_rows"] == 0 and t["repeat_rows"] == t["duplicate_rows"] == 285490
    # twelve sglang 0.5.14 DSA tables name several GLM-5 aliases, each for different dtypes
    with_groups = [f for f in report.files if f.alias_groups]
    assert len(with_groups) == 12
    assert {(f.ref.backend, f.ref.version, f.ref.table) for f in with_groups} == {
        ("sglang", "0.5.14", "dsa_context_module"), ("sglang", "0.5.14", "dsa_generation_module")}
    assert all(g.native == 64 and g.shared_keys == 0 for f in with_groups for g in f.alias_groups)


# --- the output folder is owned ------------------------------------------------------------------


def test_write_never_replaces_a_file_it_did_not_write(fixtures: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    dest = out / "h200_sxm/mla/vllm/0.22.0/mla_context_module_perf.parquet"
    dest.parent.mkdir(parents=True)
    pq.write_table(pa.table({"a": [1]}), dest)  # someone else's parquet, in the way
    with pytest.raises(E.OutputNotOwnedError) as info:
        dedupe([str(fixtures / ALIAS)], write=out)
    assert info.value.exit_code == 2 and info.value.values["files"] == [str(dest)]
    assert pq.read_table(dest).column_names == ["a"]  # nothing was written: not even the other two tables
    assert sorted(p.name for p in out.rglob("*.parquet")) == ["mla_context_module_perf.parquet"]
    report = dedupe([str(fixtures / ALIAS)], write=out, force=True)
    assert report.ok and report.totals()["files_written"] == 3
    assert written_by_modperf(dest)
    assert dedupe([str(fixtures / ALIAS)], write=out).ok  # its own files it replaces


def test_write_to_a_file_or_a_link(fixtures: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(E.DedupeOutputError, match="OUT_DIR is not a folder"):
        dedupe([str(fixtures / ALIAS)], write=tmp_path / "file")
    out = tmp_path / "out"
    dest = out / "h200_sxm/mla/vllm/0.22.0/mla_context_module_perf.parquet"
    dest.parent.mkdir(parents=True)
    dest.symlink_to(tmp_path / "file")
    with pytest.raises(E.OutputNotOwnedError):
        dedupe([str(fixtures / ALIAS)], write=out)
    report = dedupe([str(fixtures / ALIAS)], write=out, force=True)  # --force replaces files, never writes through links
    (failed,) = [f.written for f in report.files if f.written is not None and not f.written.written]
    assert failed.failures[0].kind == "target_exists" and not report.ok
    assert (tmp_path / "file").read_text() == "x"
