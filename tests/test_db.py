"""The Database: lazy, cached, strict loading of slots (reuse-resolved), and the messages that
name what a data root holds when a slot does not exist."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

import modperf
from modperf import errors as E


def test_tables_load_once_and_reuse_slots_share_the_donors_arrays(db: modperf.Database) -> None:
    first = db.table("b300_sxm", "vllm", "0.24.0", "dsa_context_module")
    assert db.table("b300_sxm", "vllm", "0.24.0", "dsa_context_module") is first
    reused = db.table("b300_sxm", "vllm", "0.22.0", "dsa_context_module")
    assert reused.ref.reuse is not None and reused.ref.reuse.from_version == "0.24.0"
    assert reused.ref.version == "0.22.0" and first.ref.version == "0.24.0"
    assert reused.latency is first.latency  # the same arrays, seen through another slot


def test_unknown_slots_name_what_exists(db: modperf.Database) -> None:
    with pytest.raises(E.UnknownTableError) as info:
        db.table("h200_sxm", "vllm", "9.9.9", "mla_context_module")
    assert info.value.exit_code == 2
    # nearest first: the same system and backend, then the same system
    assert info.value.fix.startswith("available: h200_sxm/vllm/0.24.0, h200_sxm/trtllm/1.3.0rc20, ")
    with pytest.raises(E.UnknownTableError, match="did you mean mla_context_module"):
        db.table("h200_sxm", "vllm", "0.24.0", "mla_context_modul")
    with pytest.raises(E.UnknownTableError, match="did you mean system h200_sxm"):
        db.table("h200", "vllm", "0.24.0", "mla_context_module")


def test_tables_iterates_every_declared_slot(db: modperf.Database) -> None:
    tables = list(db.tables(system="h200_sxm", backend="sglang", version="0.5.14"))
    families: dict[str, list[str]] = {}
    for t in tables:
        families.setdefault(t.family.name, []).append(t.ref.table)
    assert {f: sorted(ts) for f, ts in families.items()} == {
        "gqa": ["context_attention", "generation_attention"], "mla_kernel": ["context_mla", "generation_mla", "mla_bmm"],
        "dsa": ["dsa_context_module", "dsa_generation_module"],
        "dsv4": ["dsv4_csa_context_module", "dsv4_csa_generation_module", "dsv4_hca_context_module",
                 "dsv4_hca_generation_module"],
        "sparse_kernel": ["dsv4_csa_topk_calib", "dsv4_paged_mqa_logits_module", "glm5_dsa_attn_module",
                          "glm5_mqa_logits_module", "glm5_topk_module"],
        "gemm": ["gemm"], "moe": ["moe"], "custom_allreduce": ["custom_allreduce"],
        "quantize": ["computescale", "scale_matrix"], "linear_attention": ["gdn"], "mhc": ["mhc_module"],
        "encoder_attention": ["encoder_attention"]}


def test_a_rejected_table_raises_with_every_failure(tmp_path: Path) -> None:
    src = modperf.open().ref("h200_sxm", "sglang", "0.5.14", "context_mla").path
    table = pq.read_table(src)
    folder = tmp_path / "h200_sxm" / "mla" / "sglang" / "0.5.14"
    folder.mkdir(parents=True)
    pq.write_table(table.drop_columns(["op_name"]), folder / "context_mla_perf.parquet")
    db = modperf.open(tmp_path)
    with pytest.raises(E.TableRejectedError) as info:
        db.table("h200_sxm", "sglang", "0.5.14", "context_mla")
    kinds = sorted(f.kind for f in info.value.failures)
    assert kinds == ["missing_column"] and info.value.exit_code == 1
    assert info.value.failures[0].values == {"table": "context_mla", "column": "op_name"}
