"""Model-level estimates: every number is the sum of the layer queries it is made of."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import modperf
from modperf import errors as E
from modperf.model.estimate import estimate


def fastest(db: modperf.Database, kernels: list[str], **fields) -> modperf.query.engine.engine.Answer:
    """The kernel policy, restated: the fastest answer that needs no extrapolation."""
    answers = []
    for ks in kernels:
        try:
            answers.append(db.query(**fields, kernel_source=ks))
        except (E.NotCoveredError, E.OutOfCoverageError):
            pass
    return min(answers, key=lambda a: (a.kind == "extrapolated", a.latency_ms))


def test_mla_model_sums_its_layer_queries(db):
    est = estimate(db, model="deepseek-ai/DeepSeek-V3", system="h200_sxm", backend="vllm", tps=[1, 8],
                   isl=2048, osl=512, batch=8)
    assert est.versions == {"mla_context_module": "0.24.0", "mla_generation_module": "0.24.0"}
    assert [layer.label for layer, _ in est.schedule.groups()] == ["MLA"]
    # gemm_type follows the checkpoint (fp8_block); the other dtypes default to bfloat16
    slot = dict(system="h200_sxm", backend="vllm", version="0.24.0", model="deepseek-ai/DeepSeek-V3",
                mla_dtype="bfloat16", kv_cache_dtype="bfloat16", gemm_type="fp8_block")
    for tp_est in est.tps:
        ctx = fastest(db, ["FLASH_ATTN", "FLASH_ATTN_MLA"], table="mla_context_module", **slot, tp_size=tp_est.tp,
                      batch_size=8, isl=2048, step=0)
        gen = db.query(table="mla_generation_module", **slot, tp_size=tp_est.tp, batch_size=8, step=2048 + 256)
        assert tp_est.prefill_ms == pytest.approx(61 * ctx.latency_ms, rel=1e-12)
        assert tp_est.decode_ms == pytest.approx(61 * gen.latency_ms, rel=1e-12)
        assert tp_est.prefill[0].components[0].kernel_source == ctx.fields["kernel_source"]
        assert tp_est.prefill[0].components[0].fields["gemm_type"] == "fp8_block"
        assert tp_est.kinds("prefill") == {"exact": 61, "interpolated": 0, "extrapolated": 0}
        assert tp_est.kinds("decode") == {"exact": 0, "interpolated": 61, "extrapolated": 0}  # kv 2304 is off-grid
    assert est.tps[0].local_heads == 128 and est.tps[1].local_heads == 16
    assert est.tps[1].prefill_ms < est.tps[0].prefill_ms


def test_gqa_blocks_add_their_projection_gemms(db, models):
    cfg = models.get("meta-llama/Meta-Llama-3.1-70B")
    hidden, heads, kv, hd = 8192, 64, 8, 128
    assert (cfg.get("hidden_size"), cfg.native_heads, cfg.kv_heads) == (hidden, heads, kv)
    est = estimate(db, model="meta-llama/Meta-Llama-3.1-70B", system="h200_sxm", backend="trtllm", tps=[2, 8],
                   isl=1024, osl=256, batch=4)
    slot = dict(system="h200_sxm", backend="trtllm", version="1.3.0rc20")
    for tp_est in est.tps:
        tp = tp_est.tp
        local, local_kv = heads // tp, max(1, kv // tp)
        attn = fastest(db, ["torch_flow", "torch_flow_flashinfer"], table="context_attention", **slot,
                       num_heads=local, num_key_value_heads=local_kv, head_dim=hd, window_size=0, beam_width=1,
                       attn_dtype="bfloat16", kv_cache_dtype="bfloat16", batch_size=4, isl=1024, step=0)
        qkv = db.query(table="gemm", **slot, gemm_dtype="bfloat16", m=4 * 1024, n=(local + 2 * local_kv) * hd, k=hidden)
        out = db.query(table="gemm", **slot, gemm_dtype="bfloat16", m=4 * 1024, n=hidden, k=local * hd)
        per_layer = attn.latency_ms + qkv.latency_ms + out.latency_ms
        assert tp_est.prefill_ms == pytest.approx(80 * per_layer, rel=1e-12)
        names = [c.name for c in tp_est.prefill[0].components]
        assert names == ["attention", "qkv_proj", "o_proj"]
    assert any("QKV and output projections from the gemm table" in n for n in est.notes)


def test_kimi_k3_and_deepseek_v3_from_their_own_buckets(db):
    kimi = estimate(db, model="moonshotai/Kimi-K3", system="gb300", backend="vllm", tps=[1, 2, 4, 8],
                    isl=2048, osl=128, batch=4)
    v3 = estimate(db, model="deepseek-ai/DeepSeek-V3", system="gb300", backend="vllm", tps=[1, 2, 4, 8],
                  isl=2048, osl=128, batch=4)
    assert kimi.versions["mla_context_module"] == "0.27.0"
    for tp_est in kimi.tps:
        for cost in (*tp_est.prefill, *tp_est.decode):
            assert cost.count == 24  # full-attention layers; 69 KDA layers are listed as not included
            assert cost.components[0].native == 96
            assert cost.components[0].substitution is None
    assert [(d["label"], d["count"]) for d in kimi.to_dict()["not_included"]] == [("KDA linear attention", 69)]
    for tp_est in v3.tps:
        assert {c.components[0].native for c in (*tp_est.prefill, *tp_est.decode)} == {128}
    # Kimi-K3 at tp=1 runs 96 local heads, DeepSeek-V3 at tp=1 runs 128: different buckets, different numbers
    assert kimi.tps[0].prefill[0].per_layer_ms != v3.tps[0].prefill[0].per_layer_ms


def test_missing_native_is_refused_unless_substitution_is_allowed(db):
    args = dict(model="moonshotai/Kimi-K2-Instruct", system="h200_sxm", backend="vllm", tps=[1, 8], isl=1024,
                osl=64, batch=2)
    with pytest.raises(E.NotCoveredError) as info:
        estimate(db, **args)
    assert "has no native-64 bucket for this key; it holds native head counts 128" in str(info.value)
    est = estimate(db, **args, allow_substitute=True)
    for tp_est in est.tps:
        assert tp_est.substitutions == [
            "native 64 is not measured in this table; answered from the nearest native bucket, 128 (allow_substitute)"]
        assert all(c.components[0].native == 128 for c in tp_est.prefill)
    assert any("no h200_sxm/vllm version holds a native-64 bucket" in n for n in est.notes)


def test_deepseek_v4_flash_and_pro_differ_at_equal_local_heads(db):
    common = dict(system="b200_sxm", backend="sglang", isl=2048, osl=256, batch=8)
    flash = estimate(db, model="deepseek-ai/DeepSeek-V4-Flash", tps=[1], **common)  # 64 local heads
    pro = estimate(db, model="deepseek-ai/DeepSeek-V4-Pro", tps=[2], **common)  # 64 local heads
    assert flash.tps[0].local_heads == pro.tps[0].local_heads == 64

    def per_layer(est, label, phase):
        costs = est.tps[0].prefill if phase == "prefill" else est.tps[0].decode
        return next(c for c in costs if c.label == label).per_layer_ms

    for label in ("DSV4 CSA (ratio 4)", "DSV4 HCA (ratio 128)"):
        for phase in ("prefill", "decode"):
            f, p = per_layer(flash, label, phase), per_layer(pro, label, phase)
            assert f != p and math.isfinite(f) and math.isfinite(p)
    assert [(d["label"], d["count"]) for d in flash.to_dict()["not_included"]] == [
        ("DSV4 ratio 0 (sliding window only)", 2)]
    assert {c.components[0].native for c in flash.tps[0].prefill} == {64}
    assert {c.components[0].native for c in pro.tps[0].prefill} == {128}


def test_shared_indexer_layers_use_their_own_rows(db):
    est = estimate(db, model="zai-org/GLM-5.2", system="h200_sxm", backend="sglang", tps=[8], isl=1024, osl=64,
                   batch=2)
    ops = {c.label: c.components[0].fields["op_name"] for c in est.tps[0].prefill}
    assert ops == {"DSA indexer": "dsa_context_module", "DSA shared indexer": "dsa_context_module_skip_indexer"}
    assert [(c.label, c.count) for c in est.tps[0].decode] == [("DSA indexer", 21), ("DSA shared indexer", 57)]


def test_decode_mean_is_the_mean_of_the_steps(db):
    est = estimate(db, model="deepseek-ai/DeepSeek-V3", system="h200_sxm", backend="vllm", tps=[4], isl=100,
                   osl=9, batch=16, decode_mean=True)
    gen = est.tps[0].decode[0].components[0]
    steps = [db.query(table="mla_generation_module", system="h200_sxm", backend="vllm", version="0.24.0",
                      model="deepseek-ai/DeepSeek-V3", tp_size=4, batch_size=16, step=s,
                      kernel_source=gen.kernel_source, mla_dtype="bfloat16", kv_cache_dtype="bfloat16",
                      gemm_type="fp8_block").latency_ms for s in range(100, 109)]
    assert est.tps[0].decode_mean_ms == pytest.approx(61 * float(np.mean(steps)), rel=1e-9)
    assert est.tps[0].decode_mean_kinds == {"exact": 0, "interpolated": 61 * 9, "extrapolated": 0}
    assert est.decode_kv == 104


def test_bad_requests(db):
    with pytest.raises(E.ShardError) as info:
        estimate(db, model="moonshotai/Kimi-K3", system="gb300", backend="vllm", tps=[1, 64], isl=1, osl=1, batch=1)
    assert str(info.value).startswith("tp=64 does not divide the native head count 96 of moonshotai/Kimi-K3")
    assert info.value.fix == "use tp sizes that divide it: 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96"
    assert info.value.exit_code == 2
    with pytest.raises(E.UnknownModelError):
        estimate(db, model="acme/Nope", system="gb300", backend="vllm", isl=1, osl=1, batch=1)
    with pytest.raises(E.UnknownTableError, match="no tables for system=gb300 backend=tensorrt"):
        estimate(db, model="moonshotai/Kimi-K3", system="gb300", backend="tensorrt", isl=1, osl=1, batch=1)
    with pytest.raises(E.UsageError, match=r"isl must be an integer in 1\.\.4,194,304 \(tokens\)"):
        estimate(db, model="moonshotai/Kimi-K3", system="gb300", backend="vllm", isl=0, osl=1, batch=1)
    # a version the system does not hold at all: refused as the whole-model scope and predict refuse it
    # (the version policy, modperf.data.versions)
    with pytest.raises(E.OptionValueError) as unknown:
        estimate(db, model="moonshotai/Kimi-K3", system="gb300", backend="vllm", version="0.9.9", isl=1, osl=1,
                 batch=1)
    assert str(unknown.value) == ("gb300/vllm has no version '0.9.9' [version='0.9.9']. Fix: versions: 0.1.dev19262, "
                                  "0.14.0, 0.19.0, 0.22.0, 0.24.0, 0.27.0")
    # a version it holds, without the model's tables: each missing table from the nearest version
    # holding it that measured Kimi-K3's 96 heads (0.24.0 holds only 128), said in a note
    held = estimate(db, model="moonshotai/Kimi-K3", system="gb300", backend="vllm", version="0.19.0", isl=1024,
                    osl=1, batch=1, tps=[8])
    assert ("version 0.19.0 has no mla_context_module, mla_generation_module table; nearest version holding it: "
            "mla_context_module 0.27.0, mla_generation_module 0.27.0") in held.notes
    # a pinned version that holds the tables but not Kimi-K3's native: refused, never borrowed
    with pytest.raises(E.NotCoveredError, match="has no native-96 bucket for this key; it holds native head counts 128"):
        estimate(db, model="moonshotai/Kimi-K3", system="gb300", backend="vllm", version="0.24.0", isl=1024,
                 osl=1, batch=1)


def test_json_is_plain_data(db):
    est = estimate(db, model="MiniMaxAI/MiniMax-M3", system="h200_sxm", backend="vllm", tps=[1, 2], isl=512,
                   osl=32, batch=1)
    doc = json.loads(json.dumps(est.to_dict()))
    assert [(g["label"], g["count"]) for g in doc["layers"]] == [("GQA dense (MSA model)", 3), ("MSA sparse", 57)]
    assert doc["tps"][1]["local_heads"] == 32
    assert doc["decode_rule"] == "one decode step at kv length isl + osl // 2 = 528"


def test_one_phase_out_of_coverage_leaves_the_other_answering(db):
    # batch 64 x isl 4095 prefills 262,080 tokens: the projection GEMM's m is 8x past the measured
    # 32,768 (3 octaves, past the limit); the decode step of the same deployment still answers
    est = estimate(db, model="Qwen/Qwen3-32B", system="h200_sxm", backend="vllm", tps=[1, 2], isl=4095, osl=512,
                   batch=64)
    assert not est.complete
    for t in est.tps:
        assert t.prefill_ms is None and t.prefill == []
        assert isinstance(t.prefill_error, E.OutOfCoverageError)
        assert str(t.prefill_error).startswith(f"GQA full layers, prefill at tp={t.tp}: gemm: point {{'m': 262080")
        assert t.decode_error is None and t.decode_ms > 0
    doc = est.to_dict()
    assert doc["complete"] is False and doc["tps"][0]["prefill_ms"] is None
    assert doc["tps"][0]["prefill_error"]["type"] == "OutOfCoverageError"
    # nothing answering at all is the first reason, raised
    with pytest.raises(E.OutOfCoverageError):
        estimate(db, model="Qwen/Qwen3-32B", system="h200_sxm", backend="vllm", tps=[1], isl=4095, osl=512,
                 batch=64, decode_kv=4_000_000)


def test_decode_kv_and_the_checkpoint_dtype(db):
    est = estimate(db, model="deepseek-ai/DeepSeek-V3", system="h200_sxm", backend="vllm", tps=[8], isl=2048,
                   osl=512, batch=8, decode_kv=4096)
    assert est.decode_kv == 4096 and est.decode_rule == "one decode step at kv length 4096 (decode_kv)"
    (gen,) = est.tps[0].decode[0].components
    assert gen.fields["step"] == 4096 and gen.fields["gemm_type"] == "fp8_block"
    assert est.dtypes["mla_generation_module"]["gemm_type"] == "fp8_block"
    assert est.served == {"model": "deepseek-ai/DeepSeek-V3", "gemm": "fp8_block", "moe": "fp8_block",
                          "checkpoint": {"gemm": "fp8_block", "moe": "fp8_block", "source": "quantization_config: "
                                         "quant_method fp8, weight_block_size [128, 128]"}}
    # a dtype is the deployment's choice: the one given wins, and every layer is priced in it
    bf16 = estimate(db, model="deepseek-ai/DeepSeek-V3", system="h200_sxm", backend="vllm", tps=[8], isl=2048,
                    osl=512, batch=8, decode_kv=4096, dtypes={"gemm_type": "bfloat16"})
    (gen,) = bf16.tps[0].decode[0].components
    assert gen.fields["gemm_type"] == "bfloat16" and bf16.dtypes["mla_context_module"]["gemm_type"] == "bfloat16"
    assert bf16.served["model"] == "deepseek-ai/DeepSeek-V3@gemm=bfloat16,moe=fp8_block"
    assert bf16.notes[0] == ("dtypes chosen: deepseek-ai/DeepSeek-V3 served with its linear layers as bfloat16 (its "
                             "checkpoint: fp8_block), as deepseek-ai/DeepSeek-V3@gemm=bfloat16,moe=fp8_block")
    asked = db.query(table="mla_generation_module", system="h200_sxm", backend="vllm", version="0.24.0",
                     model="deepseek-ai/DeepSeek-V3", tp_size=8, batch_size=8, step=4096, gemm_type="bfloat16",
                     kernel_source=gen.kernel_source)
    assert gen.latency_ms == asked.latency_ms and bf16.tps[0].decode_ms == 61 * asked.latency_ms
    # the two names of the dense layers' dtype must agree; a dtype no table keys is refused
    with pytest.raises(E.UsageError, match="gemm_type=bfloat16 and gemm_dtype=fp8_block both name the dtype of "
                                           "deepseek-ai/DeepSeek-V3's linear layers"):
        estimate(db, model="deepseek-ai/DeepSeek-V3", system="h200_sxm", backend="vllm", tps=[8], isl=2048,
                 osl=512, batch=8, dtypes={"gemm_type": "bfloat16", "gemm_dtype": "fp8_block"})
    with pytest.raises(E.OptionValueError, match=r"^attn_dtype=fp8: no table this estimate prices "
                                                 r"\(mla_context_module, mla_generation_module\) keys attn_dtype"):
        estimate(db, model="deepseek-ai/DeepSeek-V3", system="h200_sxm", backend="vllm", tps=[8], isl=2048,
                 osl=512, batch=8, dtypes={"attn_dtype": "fp8"})


def test_mla_without_module_tables_is_composed_from_its_parts(db):
    """DeepSeek-V3 on h200 sglang: no MLA module tables, but the MLA kernel, mla_bmm and GEMM
    tables are there. Each part restated as its own query."""
    est = estimate(db, model="deepseek-ai/DeepSeek-V3", system="h200_sxm", backend="sglang", tps=[8], isl=2048,
                   osl=512, batch=8)
    assert est.versions == {"context_mla": "0.5.14", "generation_mla": "0.5.14", "mla_bmm": "0.5.14",
                            "gemm": "0.5.14"}
    prefill, decode = est.tps[0].prefill[0], est.tps[0].decode[0]
    assert prefill.composed and decode.composed
    assert [c.name for c in prefill.components] == ["qkv_a_proj", "q_b_proj", "kv_b_proj", "attention", "o_proj"]
    assert [c.name for c in decode.components] == ["qkv_a_proj", "q_b_proj", "bmm_pre", "attention", "bmm_post",
                                                   "o_proj"]
    slot = dict(system="h200_sxm", backend="sglang", version="0.5.14")

    def gemm(m: int, n: int, k: int) -> float:
        # fp8_block: the checkpoint's dtype; the fastest of the kernels measured for it
        return fastest(db, ["sglang_deepgemm_gemm_nt_f8f8bf16", "sglang_sgl_kernel_fp8_scaled_mm",
                            "sglang_torch_linear"], table="gemm", **slot, gemm_dtype="fp8_block", m=m, n=n,
                       k=k).latency_ms

    local = 128 // 8
    t = 8 * 2048
    expected_prefill = (gemm(t, 1536 + 512 + 64, 7168) + gemm(t, local * 192, 1536) + gemm(t, local * 256, 512)
                        + db.query(table="context_mla", **slot, num_heads=local, batch_size=8, isl=2048, step=0,
                                   kv_cache_dtype="bfloat16").latency_ms
                        + gemm(t, 7168, local * 128))
    assert prefill.per_layer_ms == pytest.approx(expected_prefill, rel=1e-12)
    bmm = ["sglang_sgl_kernel_bmm_fp8", "sglang_torch_bmm"]
    expected_decode = (gemm(8, 2112, 7168) + gemm(8, local * 192, 1536)
                       + fastest(db, bmm, table="mla_bmm", **slot, op_name="mla_gen_pre", bmm_dtype="bfloat16",
                                 num_heads=local, num_tokens=8).latency_ms
                       + db.query(table="generation_mla", **slot, num_heads=local, batch_size=8, step=2048 + 256,
                                  kv_cache_dtype="bfloat16").latency_ms
                       + fastest(db, bmm, table="mla_bmm", **slot, op_name="mla_gen_post", bmm_dtype="bfloat16",
                                 num_heads=local, num_tokens=8).latency_ms
                       + gemm(8, 7168, local * 128))
    assert decode.per_layer_ms == pytest.approx(expected_decode, rel=1e-12)
    assert est.tps[0].prefill_ms == pytest.approx(61 * expected_prefill, rel=1e-12)
    assert any("composed from context_mla, generation_mla, mla_bmm, gemm" in n for n in est.notes)
    # where module tables exist, they are used unless composition is asked for
    both = dict(model="deepseek-ai/DeepSeek-V3", system="h200_sxm", backend="trtllm", version="1.3.0rc20", tps=[8],
                isl=2048, osl=512, batch=8)
    assert not estimate(db, **both).tps[0].prefill[0].composed
    assert estimate(db, **both, mla="composed").tps[0].prefill[0].composed


def test_bounds_at_the_entry(db):
    kimi = dict(model="moonshotai/Kimi-K3", system="gb300", backend="vllm")
    with pytest.raises(E.OptionValueError, match=r"--kernel-source names table\(s\) this estimate does not use: 'nope'"):
        estimate(db, **kimi, isl=8, osl=8, batch=1, kernel_sources={"nope": "FLASH_ATTN"})
    with pytest.raises(E.UsageError, match=r"batch must be an integer in 1\.\.1,048,576"):
        estimate(db, **kimi, isl=8, osl=8, batch=2**30)
    with pytest.raises(E.UsageError, match=r"a sequence \(prefix \+ isl, isl \+ osl\) is at most 4,194,304 tokens"):
        estimate(db, **kimi, isl=2**21, osl=2**21 + 1, batch=1)
    with pytest.raises(E.OptionValueError, match=r"tp sizes must be positive integers in 1\.\.4,096"):
        estimate(db, **kimi, isl=8, osl=8, batch=1, tps=[10**12])


def test_configs_that_used_to_hang_are_refused_at_once(fixtures, tmp_path):
    """1e9 heads at tp 3 enumerated a billion divisors; 1e7 layers built a 1e7-layer schedule."""
    import time

    raw = json.loads((fixtures / "09_hf_configs" / "deepseek-ai--DeepSeek-V3_config.json").read_text())
    for name, change in (("Heads", {"num_attention_heads": 10**9}), ("Layers", {"num_hidden_layers": 10**7})):
        (tmp_path / f"acme--{name}_config.json").write_text(json.dumps({**raw, **change}))
    db = modperf.open(model_configs=[tmp_path])
    for model in ("acme/Heads", "acme/Layers"):
        start = time.perf_counter()
        with pytest.raises(E.ModelConfigError, match="must be an integer in"):
            estimate(db, model=model, system="gb300", backend="vllm", tps=[3], isl=8, osl=8, batch=1)
        assert time.perf_counter() - start < 2
