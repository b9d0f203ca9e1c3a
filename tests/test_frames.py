"""Rows handed to a user's tools: KeyedTable.to_arrow, answers_to_arrow, to_frame, KINDS and
query_many's kind names (issue 25, "Rows users can take away")."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import modperf
from modperf import errors as E

KIMI = dict(table="mla_context_module", system="gb300", backend="vllm", version="0.27.0", model="moonshotai/Kimi-K3",
            tp_size=8, kernel_source="FLASH_ATTN", kv_cache_dtype="bfloat16", gemm_type="bfloat16")


def test_a_table_hands_over_its_measured_points(db) -> None:
    keyed = db.table("gb300", "vllm", "0.27.0", "mla_context_module")
    rows = keyed.to_arrow()
    assert rows.num_rows == keyed.n_points == 21860
    assert rows.column_names == ["op_name", "kernel_source", "mla_dtype", "kv_cache_dtype", "gemm_type", "native",
                                 "num_heads", "batch_size", "isl", "step", "latency_ms", "merged_rows", "models"]
    point = [r for r in rows.to_pylist() if (r["kernel_source"], r["native"], r["num_heads"], r["batch_size"],
                                              r["isl"], r["step"], r["kv_cache_dtype"], r["mla_dtype"],
                                              r["gemm_type"]) == ("FLASH_ATTN", 96, 12, 4, 2048, 0, "bfloat16",
                                                                  "bfloat16", "bfloat16")]
    assert len(point) == 1 and point[0]["latency_ms"] == db.query(**KIMI, batch_size=4, isl=2048).latency_ms == 0.4078
    assert point[0]["models"] == "moonshotai/Kimi-K3" and point[0]["merged_rows"] == 1
    gemm = db.table("h200_sxm", "vllm", "0.24.0", "gemm").to_arrow()  # no head axis: no native, no models
    assert gemm.num_rows == 107225 and "native" not in gemm.column_names
    assert gemm.column("models").null_count == gemm.num_rows


def test_answers_become_one_row_each_errors_included(db) -> None:
    answer = db.query(**KIMI, batch_size=4, isl=2048)
    batch_error = {"error": {"kind": "not_covered", "message": "no bucket"}}
    table = modperf.answers_to_arrow([answer, json.loads(json.dumps(answer.to_dict())), batch_error])
    rows = table.to_pylist()
    assert table.num_rows == 3 and table.column_names[:4] == ["latency_ms", "kind", "table", "system"]
    assert rows[0] == rows[1]
    assert (rows[0]["latency_ms"], rows[0]["kind"], rows[0]["native"], rows[0]["local"], rows[0]["batch_size"],
            rows[0]["isl"], rows[0]["model"]) == (0.4078, "exact", 96, 12, 4, 2048, "moonshotai/Kimi-K3")
    assert (rows[2]["kind"], rows[2]["error"], rows[2]["latency_ms"]) == ("error", "no bucket", None)
    with pytest.raises(E.UsageError, match="an answer is an Answer or its dict, not int"):
        modperf.answers_to_arrow([1])


def test_frames_where_the_library_is_installed(db, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pandas")
    frame = db.table("gb300", "vllm", "0.27.0", "mla_context_module").to_frame()
    assert frame.shape == (21860, 13) and float(frame["latency_ms"].max()) > 0
    answers = modperf.to_frame(modperf.answers_to_arrow([db.query(**KIMI, batch_size=4, isl=2048)]))
    assert answers["latency_ms"].tolist() == [0.4078]
    monkeypatch.setitem(sys.modules, "polars", None)  # polars not installed: said, with how to install it
    with pytest.raises(E.UsageError, match=r"polars is not installed .*Fix: pip install polars"):
        modperf.to_frame(modperf.answers_to_arrow([]), "polars")
    with pytest.raises(E.OptionValueError, match="no frame library 'excel'"):
        modperf.to_frame(modperf.answers_to_arrow([]), "excel")


def test_kind_codes_have_names(db) -> None:
    assert modperf.KINDS == {0: "exact", 1: "interpolated", 2: "extrapolated", -1: "refused"}
    axes = dict(batch_size=np.array([1, 4, 6, 100000]), isl=np.array([2048, 2048, 2048, 2048]))
    lat, codes = db.query_many(**KIMI, **axes)
    lat2, names = db.query_many(**KIMI, **axes, kinds_as_str=True)
    assert codes.tolist() == [0, 0, 1, -1] and names.tolist() == ["exact", "exact", "interpolated", "refused"]
    assert [modperf.KINDS[c] for c in codes.tolist()] == names.tolist()
    np.testing.assert_array_equal(lat, lat2)
    assert lat[1] == 0.4078 and np.isnan(lat[3])


def test_export_from_python_fails_closed(db, tmp_path) -> None:
    from modperf.audit.export import SLOT_COLUMNS

    done = modperf.export(db, tmp_path / "mla.csv", system="gb300", table="mla_context_module", version="0.27.0")
    assert done.ok and done.rows == 21860 and done.columns[:5] == list(SLOT_COLUMNS)
    root = tmp_path / "root" / "h200_sxm" / "gemm" / "vllm" / "0.24.0"
    root.mkdir(parents=True)
    (root / "gemm_perf.parquet").write_bytes(b"not parquet")
    failed = modperf.export(modperf.open(tmp_path / "root"), tmp_path / "h200.parquet", system="h200_sxm")
    assert not failed.written and not (tmp_path / "h200.parquet").exists()
    assert [f.kind for f in failed.failures] == ["table_rejected"]
    with pytest.raises(E.UnknownTableError, match="did you mean table mla_context_module"):
        modperf.export(db, tmp_path / "x.csv", system="gb300", table="mla_contxt_module")
