"""modperf.audit.writer: real corpus rows replayed through the writer come out as the same table,
load through the strict loaders, and every bad measurement is refused at the add() that
carries it with a typed error."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.helpers import replay, split_columns

from modperf import errors as E
from modperf.audit.check import check
from modperf.audit.writer import SIDECAR, open_writer
from modperf.base import limits
from modperf.base.atomic import temp_files
from modperf.data.loader import load_table
from modperf.specs.models import ModelRegistry

CSA_GEN = "07_latent_collision/wheel/b200_sxm/sparse_attention/sglang/0.5.14/dsv4_csa_generation_module_perf.parquet"
HCA_ATTN = "05_dsv4_sparse_kernel/wheel/b200_sxm/sparse_attention/vllm/0.24.0/dsv4_hca_attn_module_perf.parquet"
TOPK = "05_dsv4_sparse_kernel/wheel/b200_sxm/sparse_attention/sglang/0.5.14/dsv4_csa_topk_calib_perf.parquet"
GQA = "04_gqa_attention/wheel/a100_sxm/attention/trtllm/1.0.0/context_attention_perf.parquet"
PRO = "deepseek-ai/DeepSeek-V4-Pro"
FLASH_FP8 = "sgl-project/DeepSeek-V4-Flash-FP8"


@pytest.fixture
def pro_rows(fixtures: Path) -> pa.Table:
    table = pq.read_table(fixtures / CSA_GEN)
    return table.filter(pc.equal(table.column("model"), PRO))


def module_writer(root: Path, **kwargs):
    fixed = dict(framework="SGLang", device="NVIDIA B200", op_name="dsv4_csa_generation_module",
                 kernel_source="compressed_flashmla", mla_dtype="bfloat16", kv_cache_dtype="fp8_e4m3",
                 gemm_type="fp8_block", compress_ratio=4)
    where = dict(system="b200_sxm", backend="sglang", version="0.5.14")
    for name in list(kwargs):
        if name in where:
            where[name] = kwargs.pop(name)
    fixed.update(kwargs)
    return open_writer("dsv4_csa_generation_module", root=root, **where, **fixed)


ROW = dict(batch_size=1, isl=1, step=1024)


# --- round trips on real rows ----------------------------------------------------------------------


def test_replayed_module_rows_come_out_as_the_corpus_table(pro_rows: pa.Table, tmp_path: Path) -> None:
    """1600 DeepSeek-V4-Pro rows, num_heads left out (derived as 128 // tp_size)."""
    writer = replay(pro_rows, tmp_path, "dsv4_csa_generation_module", leave_out=("num_heads",),
                    system="b200_sxm", backend="sglang", model=PRO)
    result = writer.result
    assert result is not None and result.rows == 1600 and result.natives == [128] and result.models == [PRO]
    path = tmp_path / "b200_sxm/sparse_attention/sglang/0.5.14/dsv4_csa_generation_module_perf.parquet"
    assert result.path == path
    written = pq.read_table(path)
    assert written.equals(pro_rows, check_metadata=True)  # same schema, order, every value
    # through the strict loader: exact stored latencies per key
    keyed = load_table(writer.ref, ModelRegistry.default())
    assert keyed.rows_read == 1600 and keyed.duplicates_merged == 0
    first = pro_rows.slice(0, 1).to_pylist()[0]
    key = (first["op_name"], first["kernel_source"], first["mla_dtype"], first["kv_cache_dtype"], first["gemm_type"],
           4, 128, first["num_heads"])
    bucket = keyed.bucket(keyed.bucket_id(key))
    hit = (bucket["axes"]["batch_size"] == first["batch_size"]) & (bucket["axes"]["step"] == first["step"])
    assert bucket["latency"][hit].tolist() == [first["latency"]]
    # the gate collectors in other languages use
    assert check([str(path)]).ok
    meta = yaml.safe_load((path.parent / SIDECAR).read_text())
    assert meta["runtime"] == {"framework": "sglang", "version": "0.5.14"}
    entry = meta["tables"]["dsv4_csa_generation_module_perf"]
    assert (entry["rows"], entry["status"], entry["written_by"]) == (1600, "complete", "modperf 0.1.0")
    assert temp_files(path.parent) == []


def test_native_keyed_kernel_rows_take_the_native_count(fixtures: Path, tmp_path: Path) -> None:
    """dsv4_hca_attn_module stores native num_heads and local_num_heads: both derived."""
    original = pq.read_table(fixtures / HCA_ATTN)
    writer = replay(original, tmp_path, "dsv4_hca_attn_module", leave_out=("num_heads", "local_num_heads"),
                    system="b200_sxm", backend="vllm", model=FLASH_FP8)
    assert pq.read_table(writer.path).equals(original, check_metadata=True)
    assert writer.result.natives == [64]


def test_zero_latency_is_kept_only_where_the_table_allows_it(fixtures: Path, tmp_path: Path) -> None:
    """dsv4_csa_topk_calib records 0 ms where the top-k selects everything."""
    original = pq.read_table(fixtures / TOPK)
    flash = original.filter(pc.equal(original.column("model"), FLASH_FP8))
    zeros = flash.filter(pc.equal(flash.column("latency"), 0.0))
    assert zeros.num_rows > 0
    writer = replay(flash, tmp_path, "dsv4_csa_topk_calib", leave_out=("num_heads",), system="b200_sxm",
                    backend="sglang", model=FLASH_FP8)
    written = pq.read_table(writer.path)
    assert written.num_rows == flash.num_rows
    assert written.column("latency").to_pylist() == flash.column("latency").to_pylist()
    # a zero where the candidates outnumber k is a failed measurement
    fixed, per_row = split_columns(flash, ("latency", "num_heads"))
    fixed.pop("model")
    fixed.pop("version")
    w = open_writer("dsv4_csa_topk_calib", root=tmp_path / "other", system="b200_sxm", backend="sglang",
                    version="0.5.14", model=FLASH_FP8, **fixed)
    row = {n: flash.column(n)[0].as_py() for n in per_row}
    row.update(isl=1 << 20, step=0)
    with pytest.raises(E.MeasurementLatencyError, match="allows 0 only where"):
        w.add(0.0, **row)


def test_gqa_rows_without_model_or_tp(fixtures: Path, tmp_path: Path) -> None:
    original = pq.read_table(fixtures / GQA).slice(0, 300)
    writer = replay(original, tmp_path, "context_attention", leave_out=(), system="a100_sxm",
                    backend="trtllm")
    written = pq.read_table(writer.path)
    # the corpus schema puts window_size after step (16 of 30 files); this older file has it earlier
    assert written.schema.names[-3:] == ["step", "window_size", "latency"]
    assert written.select(original.column_names).equals(original)


# --- each bad measurement, refused at its call ------------------------------------------------------


def test_each_bad_measurement_is_refused_at_its_call(tmp_path: Path) -> None:
    w = module_writer(tmp_path, model=PRO)
    assert w.add(0.1688, tp_size=1, **ROW) == 0
    assert w.add(0.1646, tp_size=2, num_heads=64, **ROW) == 1
    cases = [
        (dict(latency=0.2, tp_size=2, foo=1, **ROW), E.UnknownMeasurementColumnError, "'foo' is not a column"),
        (dict(latency=0.2, tp_size=2, batch_size=1, isl=1), E.MissingMeasurementKeyError, "missing key column(s) ['step']"),
        (dict(latency=0.0, tp_size=2, **ROW), E.MeasurementLatencyError, "finite and > 0 ms"),
        (dict(latency=-0.5, tp_size=2, **ROW), E.MeasurementLatencyError, "finite and > 0 ms"),
        (dict(latency=math.nan, tp_size=2, **ROW), E.MeasurementLatencyError, "finite and > 0 ms"),
        (dict(latency=math.inf, tp_size=2, **ROW), E.MeasurementLatencyError, "finite and > 0 ms"),
        (dict(latency="0.2", tp_size=2, **ROW), E.MeasurementLatencyError, "must be a number"),
        (dict(latency=0.2, tp_size=4, num_heads=64, **ROW), E.MeasurementRankLocalError, "num_heads * tp_size != native"),
        (dict(latency=0.2, tp_size=4, num_heads=128, **ROW), E.NativeSweepError, "retired native convention"),
        (dict(latency=0.2, tp_size=3, **ROW), E.MeasurementRankLocalError, "native does not divide by tp_size"),
        (dict(latency=0.2, tp_size=2, num_heads=64.0, **ROW), E.MeasurementValueError, "'num_heads' must be an integer"),
        (dict(latency=0.2, tp_size=True, **ROW), E.MeasurementValueError, "'tp_size' must be an integer"),
        (dict(latency=0.2, tp_size=0, **ROW), E.MeasurementValueError, "'tp_size' must be > 0"),
        (dict(latency=0.2, tp_size=2, compress_ratio=128, **ROW), E.MeasurementValueError, "fixed at open"),
        (dict(latency=0.2, tp_size=2, batch_size=1, isl=1, step=-1), E.MeasurementValueError, "'step' must be >= 0"),
    ]
    for kwargs, cls, text in cases:
        latency = kwargs.pop("latency")
        with pytest.raises(cls) as info:
            w.add(latency, **kwargs)
        error = info.value
        assert type(error) is cls and text in str(error), (cls, str(error))
        assert error.rows == [2] and error.file == str(w.path)  # the measurement that caused it
        assert error.fix
        assert len(w) == 2  # nothing of a refused measurement is kept
    assert w.add(0.1628, tp_size=8, **ROW) == 2
    result = w.close()
    assert result.rows == 3
    assert pq.read_table(w.path).column("num_heads").to_pylist() == [128, 64, 16]


def test_writer_errors_are_loader_errors_too() -> None:
    """A collector can catch the loader's types: a native sweep is the stale convention."""
    assert issubclass(E.NativeSweepError, E.StaleConventionError)
    assert issubclass(E.MeasurementRankLocalError, E.RankLocalError)
    assert issubclass(E.MeasurementLatencyError, E.InvalidLatencyError)
    assert issubclass(E.WrittenTableRejectedError, E.TableRejectedError)


def test_kernel_table_without_model_runs_the_stale_guard_at_close(tmp_path: Path) -> None:
    """context_mla records no model: num_heads is required, and a native sweep is caught by
    the loader's stale fingerprint when the writer closes; nothing is written."""
    w = open_writer("context_mla", root=tmp_path, system="h200_sxm", backend="trtllm", version="1.3.0rc20",
                    framework="TRTLLM", device="NVIDIA H200", op_name="mla_context", kernel_source="default",
                    mla_dtype="bfloat16", kv_cache_dtype="fp8")
    with pytest.raises(E.MissingMeasurementKeyError, match="num_heads is required"):
        w.add(0.0145, tp_size=2, batch_size=1, isl=16, step=0)
    for tp in (1, 2, 4):
        w.add(0.0145, num_heads=128, tp_size=tp, batch_size=1, isl=16, step=0)
    with pytest.raises(E.WrittenTableRejectedError) as info:
        w.close()
    assert [f.kind for f in info.value.failures] == ["stale_convention"]
    assert not w.path.exists() and not (w.path.parent / SIDECAR).exists()


def test_with_block_left_by_an_exception_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), module_writer(tmp_path, model=PRO) as w:
        w.add(0.1688, tp_size=1, **ROW)
        raise RuntimeError("collector crashed")
    assert not w.path.exists() and not w.path.parent.exists()
    with pytest.raises(E.WriterError, match="already closed"):
        w.close()


def test_open_refuses_bad_targets_and_models(tmp_path: Path) -> None:
    with pytest.raises(E.PathOutsideOutputError, match="not a single folder name"):
        module_writer(tmp_path, model=PRO, system="../escape")
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "b200_sxm").symlink_to(outside, target_is_directory=True)
    with pytest.raises(E.PathOutsideOutputError, match="outside the root folder"):
        open_writer("dsv4_csa_generation_module", root=tmp_path / "root", system="b200_sxm", backend="sglang",
                    version="0.5.14", model=PRO)
    with pytest.raises(E.UnknownModelError, match="acme--Nope_config.json"):
        module_writer(tmp_path, model="acme/Nope")
    with pytest.raises(E.UnknownTableError):
        open_writer("gemm", root=tmp_path, system="b200_sxm", backend="sglang", version="0.5.14")
    with pytest.raises(E.MissingMeasurementKeyError, match="open the writer with model="):
        module_writer(tmp_path)
    with pytest.raises(E.UnknownMeasurementColumnError, match="'colour' is not a column"):
        module_writer(tmp_path, model=PRO, colour="red")
    with pytest.raises(E.MeasurementValueError, match="'compress_ratio' must be an integer"):
        module_writer(tmp_path, model=PRO, compress_ratio="4")


def test_existing_table_needs_overwrite_and_the_sidecar_is_merged(tmp_path: Path) -> None:
    folder = tmp_path / "b200_sxm/sparse_attention/sglang/0.5.14"
    folder.mkdir(parents=True)
    (folder / SIDECAR).write_text(
        "# SPDX-License-Identifier: Apache-2.0\n\nschema_version: 1\nprovenance: collected\n"
        "runtime:\n  framework: sglang\n  version: 0.5.14\n"
        "tables:\n  dsv4_csa_context_module_perf:\n    collected_at: '2026-08-09'\n    rows: 5587\n    status: complete\n"
    )
    with module_writer(tmp_path, model=PRO, collection={"collector_ref": "abc123"}) as w:
        w.add(0.1688, tp_size=1, **ROW)
    text = (folder / SIDECAR).read_text()
    assert text.startswith("# SPDX-License-Identifier: Apache-2.0\n")
    meta = yaml.safe_load(text)
    assert meta["tables"]["dsv4_csa_context_module_perf"]["rows"] == 5587  # the other table is kept
    assert meta["tables"]["dsv4_csa_generation_module_perf"]["collector_ref"] == "abc123"
    with pytest.raises(E.TargetExistsError, match="already exists"):
        module_writer(tmp_path, model=PRO)
    before = w.path.read_bytes()
    with module_writer(tmp_path, model=PRO, overwrite=True) as w2:
        w2.add(0.1646, tp_size=2, **ROW)
    assert w2.path.read_bytes() != before and w2.result.rows == 1
    assert check([str(w2.path)]).ok


def test_sidecar_of_another_runtime_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "b200_sxm/sparse_attention/sglang/0.5.14"
    folder.mkdir(parents=True)
    (folder / SIDECAR).write_text("schema_version: 1\nruntime:\n  framework: vllm\n  version: 0.5.14\n")
    w = module_writer(tmp_path, model=PRO)
    w.add(0.1688, tp_size=1, **ROW)
    with pytest.raises(E.SidecarConflictError, match="runtime framework 'vllm'"):
        w.close()
    assert not w.path.exists() and temp_files(folder) == []


def test_a_write_failing_midway_leaves_the_old_table(tmp_path: Path, monkeypatch) -> None:
    with module_writer(tmp_path, model=PRO) as w:
        w.add(0.1688, tp_size=1, **ROW)
    before = w.path.read_bytes()
    sidecar_before = (w.path.parent / SIDECAR).read_bytes()

    def disk_full(table, where, **kwargs):
        where.write(b"PAR1" + b"\0" * 1000)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", disk_full)
    w2 = module_writer(tmp_path, model=PRO, overwrite=True)
    w2.add(0.1646, tp_size=2, **ROW)
    with pytest.raises(E.WriteFailedError, match="No space left on device"):
        w2.close()
    assert w.path.read_bytes() == before and (w.path.parent / SIDECAR).read_bytes() == sidecar_before
    assert temp_files(w.path.parent) == []


def test_empty_writer_refuses_to_close(tmp_path: Path) -> None:
    w = module_writer(tmp_path, model=PRO)
    with pytest.raises(E.WriterError, match="no measurements were added"):
        w.close()
    assert not w.path.parent.exists()


def test_native_keyed_table_refuses_local_heads_in_num_heads(tmp_path: Path) -> None:
    w = open_writer("dsv4_hca_attn_module", root=tmp_path, system="b200_sxm", backend="vllm", version="0.24.0",
                    model=FLASH_FP8, framework="VLLM", device="NVIDIA B200", op_name="dsv4_hca_attn",
                    kernel_source="flashmla", mla_dtype="bfloat16", kv_cache_dtype="fp8", gemm_type="fp8_block",
                    compress_ratio=128)
    with pytest.raises(E.MeasurementValueError, match="native-keyed table: num_heads must be the model's native"):
        w.add(0.0107, num_heads=32, tp_size=2, batch_size=1, isl=1, step=0)
    with pytest.raises(E.MeasurementRankLocalError, match="local_num_heads \\* tp_size != native"):
        w.add(0.0107, local_num_heads=64, tp_size=2, batch_size=1, isl=1, step=0)
    w.add(0.0107, tp_size=2, batch_size=1, isl=1, step=0)
    assert w.close().rows == 1
    assert pq.read_table(w.path).select(["num_heads", "local_num_heads", "tp_size"]).to_pylist() == [
        {"num_heads": 64, "local_num_heads": 32, "tp_size": 2}]


# --- integers out of range are refused at add(), never at close() -------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(column=st.sampled_from(["batch_size", "isl", "step"]),
       value=st.one_of(st.sampled_from([2**63, 2**70, 2**64 - 1, 2**62, -1, -(2**63) - 1]),
                       st.integers(min_value=2**22 + 1), st.integers(max_value=-1)))
def test_out_of_range_integers_are_refused_at_add(tmp_path_factory, column: str, value: int) -> None:
    """2**63, 2**70 and uint64 max used to be accepted by add() and fail in close() with an
    OverflowError, losing every good measurement of the session."""
    root = tmp_path_factory.mktemp("w")
    w = module_writer(root, model=PRO)
    w.add(0.41, tp_size=1, **ROW)
    with pytest.raises(E.MeasurementValueError) as info:
        w.add(0.5, tp_size=2, **{**ROW, column: value})
    assert info.value.values["column"] == column and info.value.rows == [1]
    assert f"an integer in {limits.range_of(column).describe()}" in info.value.detail
    assert len(w) == 1
    assert w.close().rows == 1  # the session's good measurement is written


@pytest.mark.parametrize("column, value, message", [
    ("tp_size", 4097, "'tp_size' must be at most 4,096"),
    ("num_heads", 2**62, "'num_heads' must be at most 65,536"),
    ("batch_size", 0, "'batch_size' must be > 0"),
])
def test_head_and_tp_bounds_at_add(tmp_path: Path, column: str, value: int, message: str) -> None:
    w = module_writer(tmp_path, model=PRO)
    row = {**ROW, "tp_size": 1, column: value}
    with pytest.raises(E.MeasurementValueError, match=message):
        w.add(0.5, **row)
