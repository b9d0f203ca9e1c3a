"""``modperf ls`` as a library call: what a data root holds, read from footers and head columns
only, without validating."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from modperf.data.inventory import list_tables


def test_one_slot_lists_rows_and_head_pairs() -> None:
    (entry,) = list_tables(system="h200_sxm", backend="sglang", version="0.5.14", table="context_mla")
    assert entry["family"] == "mla_kernel" and entry["model_head_axis"]
    assert entry["rows"] == pq.read_metadata(entry["path"]).num_rows == 1760
    # the 64-native chain (tp 1..64) and DeepSeek-V3's 128 heads at tp 1, as stored
    assert entry["head_pairs"] == ["1x64", "2x32", "4x16", "8x8", "16x4", "32x2", "64x1", "128x1"]
    assert entry["models"] == [] and entry["has_tp_size"] and entry["provenance"] == "legacy"


def test_models_are_listed_with_their_pairs() -> None:
    (entry,) = list_tables(system="gb300", backend="vllm", version="0.27.0", table="mla_context_module")
    assert entry["models"] == ["deepseek-ai/DeepSeek-V3", "moonshotai/Kimi-K3"]
    assert entry["head_pairs_by_model"]["moonshotai/Kimi-K3"] == [
        "1x1", "2x1", "4x1", "8x1", "12x1", "16x1", "24x1", "32x1", "48x1", "64x1", "96x1", "128x1"]


def test_reuse_and_shadowed_files_are_both_listed() -> None:
    entries = list_tables(system="b200_sxm", backend="vllm", version="0.22.0", table="context_attention")
    assert [(e["reused_from"], e["shadowed_by_reuse"]) for e in entries] == [("0.24.0", False), (None, True)]


def test_tables_without_the_model_head_axis_are_marked() -> None:
    (entry,) = list_tables(system="h200_sxm", backend="sglang", version="0.5.14", table="gemm")
    assert entry["family"] == "gemm" and entry["model_head_axis"] is False
    # vision-encoder heads are a head axis, but not the model's attention heads
    (vit,) = list_tables(system="h200_sxm", backend="sglang", version="0.5.14", table="encoder_attention")
    assert vit["family"] == "encoder_attention" and vit["model_head_axis"] is False and vit["has_num_heads"]
    assert entry["rows"] == 101010 and entry["has_num_heads"] is False


def test_an_unreadable_table_is_listed_with_its_error(tmp_path: Path) -> None:
    folder = tmp_path / "h200_sxm" / "mla" / "sglang" / "0.5.14"
    folder.mkdir(parents=True)
    (folder / "context_mla_perf.parquet").write_bytes(b"PAR1 not really")
    (entry,) = list_tables(str(tmp_path))
    assert entry["rows"] is None and "cannot read table" in entry["error"]
