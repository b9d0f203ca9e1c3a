"""The measured deployments and the fixed split (modperf.serving.silicon)."""

from __future__ import annotations

import collections
import hashlib

from modperf.serving.silicon import CALIBRATION, EVALUATION, question, silicon_rows, split_of


def test_the_split_rule_on_known_groups() -> None:
    key = "moonshotai/Kimi-K2.5|b200_sxm|vllm|agg"
    assert int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 2 == 1
    assert split_of("moonshotai/Kimi-K2.5", "b200_sxm", "vllm", "agg") == EVALUATION
    assert split_of("Qwen/Qwen3-32B", "h100_sxm", "trtllm", "agg") == CALIBRATION


def test_the_file_splits_by_deployment_group() -> None:
    rows = silicon_rows()
    assert len(rows) == 5221
    counts = collections.Counter(r["split"] for r in rows)
    assert counts == {CALIBRATION: 2363, EVALUATION: 2858}
    by_group = collections.defaultdict(set)
    for r in rows:
        by_group[(r["model_path"], r["system"], r["backend"], r["mode"])].add(r["split"])
    assert all(len(sides) == 1 for sides in by_group.values())
    # every Kimi-K2.5 row is evaluation, every Llama-3.1-8B-Instruct row calibration
    assert {r["split"] for r in rows if r["model_path"] == "moonshotai/Kimi-K2.5"} == {EVALUATION}
    assert {r["split"] for r in rows if r["model_path"] == "meta-llama/Llama-3.1-8B-Instruct"} == {CALIBRATION}


def test_a_row_as_a_question() -> None:
    row = next(r for r in silicon_rows() if r["id"] == "minimaxm2_5_b300_vllm_fp8_agg_8192x1024_c128_cfg733")
    assert question(row) == {
        "id": "minimaxm2_5_b300_vllm_fp8_agg_8192x1024_c128_cfg733", "backend": "vllm", "backend_version": "0.19.0",
        "model_path": "MiniMaxAI/MiniMax-M2.5", "system": "b300_sxm", "precision": "fp8", "mode": "agg",
        "isl": 8192, "osl": 1024, "gemm_quant_mode": "fp8", "moe_quant_mode": "fp8", "batch_size": 128,
        "tp_size": 4, "pp_size": 1, "attention_dp_size": 1, "moe_tp_size": 4, "moe_ep_size": 1}
