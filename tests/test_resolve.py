"""Asking by model and deployment (modperf.query.resolve): realistic questions answered from the model,
its checkpoint and its layer schedule alone, every derived key checked against the stored row,
every contradiction refused with its message; the lanes a backend picks by shape; answers that
say what they are (substitution, quality findings, defaults)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tests.helpers import run_cli
from typer.testing import CliRunner

import modperf
from modperf import errors as E
from modperf.cli import app
from modperf.query.resolve import derive, layer_kinds
from modperf.specs.models import ModelRegistry

runner = CliRunner()


def stored(db: modperf.Database, system: str, backend: str, version: str, table: str, **where) -> list[float]:
    """Latencies of the rows matching ``where``, read straight from the table's file."""
    t = pq.read_table(db.ref(system, backend, version, table).path)
    mask = None
    for col, value in where.items():
        m = pc.equal(t.column(col), value)
        mask = m if mask is None else pc.and_(mask, m)
    return t.filter(mask).column("latency").to_pylist()


# --- realistic questions, by model and deployment only ----------------------------------------------


def test_dsa_context_of_deepseek_v32_at_tp8(db: modperf.Database) -> None:
    """"DSA context latency of DeepSeek-V3.2 at tp 8, batch 4, isl 2048 on h200 sglang 0.5.14?" """
    a = db.query(table="dsa_context_module", system="h200_sxm", backend="sglang", version="0.5.14",
                 model="deepseek-ai/DeepSeek-V3.2", tp_size=8, batch_size=4, isl=2048)
    assert (a.latency_ms, a.kind, a.native, a.local) == (0.8175, "exact", 128, 16)
    f = a.fields
    assert (f["op_name"], f["gemm_type"], f["kernel_source"], f["kv_cache_dtype"], f["step"]) == (
        "dsa_context_module", "fp8_block", "sglang_dsa_dense_mha_fa3", "bfloat16", 0)
    assert [a.latency_ms] == stored(db, "h200_sxm", "sglang", "0.5.14", "dsa_context_module",
                                    model="deepseek-ai/DeepSeek-V3.2", op_name="dsa_context_module",
                                    kernel_source="sglang_dsa_dense_mha_fa3", kv_cache_dtype="bfloat16",
                                    gemm_type="fp8_block", num_heads=16, batch_size=4, isl=2048, step=0)
    assert a.derived == {
        "op_name": "its indexer layers use op_name dsa_context_module",
        "gemm_type": "its checkpoint stores its linear layers as fp8_block (quantization_config: quant_method fp8, "
                     "weight_block_size [128, 128])"}
    assert a.defaults == {"kv_cache_dtype": "bfloat16 (the default where the table measured it; give kv_cache_dtype "
                                            "to choose)",
                          "step": "0 (no cached prefix; give step for a prefix)"}
    assert a.lane == {"kernel_source": "sglang_dsa_dense_mha_fa3",
                      "rule": "isl + step <= index_topk (2048): SGLang runs dense MHA"}


def test_a_given_step_is_not_reported_as_defaulted(db: modperf.Database) -> None:
    """The plan cache keys which axis fields a query gave: the same question with step given
    after one without it must not carry the "step defaulted to 0" note."""
    ask = dict(table="dsa_context_module", system="h200_sxm", backend="sglang", version="0.5.14",
               model="deepseek-ai/DeepSeek-V3.2", tp_size=8, batch_size=4, isl=1024)
    assert "step" in db.query(**ask).defaults
    given = db.query(**ask, step=0)
    assert "step" not in given.defaults and given.fields["step"] == 0


def test_qwen3_32b_decode_step_at_tp2(db: modperf.Database) -> None:
    """"Qwen3-32B decode step at tp 2?": kv heads 8 / 2 = 4 per rank, head_dim 128, full attention."""
    a = db.query(table="generation_attention", system="h200_sxm", backend="vllm", model="Qwen/Qwen3-32B",
                 tp_size=2, batch_size=16, step=1023)
    assert (a.version, a.version_chosen, a.kind, a.local) == ("0.24.0", True, "exact", 32)
    f = a.fields
    assert (f["num_key_value_heads"], f["head_dim"], f["window_size"], f["kernel_source"]) == (
        4, 128, 0, "vllm_flash_attn_fa3")
    assert [a.latency_ms] == stored(db, "h200_sxm", "vllm", "0.24.0", "generation_attention", num_heads=32,
                                    num_key_value_heads=4, head_dim=128, window_size=0, batch_size=16, step=1023,
                                    kernel_source="vllm_flash_attn_fa3", attn_dtype="bfloat16",
                                    kv_cache_dtype="bfloat16", beam_width=1)
    assert a.derived["num_key_value_heads"] == "rank-local kv heads are 4 (8 kv heads / tp 2)"
    assert a.notes[0] == ("version 0.24.0: the newest h200_sxm/vllm generation_attention (give version to "
                          "choose)")
    # past the kv count, every rank holds one kv head, replicated (tp 16: 4 q heads, 1 kv head)
    wide = db.query(table="generation_attention", system="h200_sxm", backend="vllm", model="Qwen/Qwen3-32B",
                    tp_size=16, batch_size=16, step=1023)
    assert (wide.local, wide.fields["num_key_value_heads"]) == (4, 1)
    assert wide.derived["num_key_value_heads"] == "rank-local kv heads are 1 (8 kv heads, each replicated on 2 ranks)"


def test_kimi_k3_mla_module_without_a_version(db: modperf.Database) -> None:
    a = db.query(table="mla_context_module", system="gb300", backend="vllm", model="moonshotai/Kimi-K3",
                 tp_size=8, batch_size=4, isl=2048, kernel_source="FLASH_ATTN")
    # the newest gb300 vllm version holding native 96 (0.24.0 holds DeepSeek-V3's 128 only)
    assert (a.version, a.native, a.local, a.latency_ms, a.kind) == ("0.27.0", 96, 12, 0.4078, "exact")
    assert a.fields["gemm_type"] == "bfloat16"  # compressed-tensors leaves the attention layers unquantized
    assert a.notes[0] == ("version 0.27.0: the newest gb300/vllm mla_context_module holding native 96 (give "
                          "version to choose)")


def test_deepseek_v4_pro_csa_layers(db: modperf.Database) -> None:
    a = db.query(table="dsv4_csa_context_module", system="b200_sxm", backend="sglang", version="0.5.14",
                 model="deepseek-ai/DeepSeek-V4-Pro", tp_size=8, batch_size=1, isl=4096)
    assert (a.fields["compress_ratio"], a.fields["gemm_type"], a.local) == (4, "fp8_block", 16)
    assert [a.latency_ms] == stored(db, "b200_sxm", "sglang", "0.5.14", "dsv4_csa_context_module",
                                    model="deepseek-ai/DeepSeek-V4-Pro", compress_ratio=4, gemm_type="fp8_block",
                                    kernel_source=a.fields["kernel_source"], kv_cache_dtype=a.fields["kv_cache_dtype"],
                                    num_heads=16, batch_size=1, isl=4096, step=0)


def test_layer_kinds_pick_their_own_keys(db: modperf.Database) -> None:
    q = dict(table="context_attention", system="h200_sxm", backend="sglang", version="0.5.14",
             model="openai/gpt-oss-120b", tp_size=8, batch_size=4, isl=2048)
    with pytest.raises(E.QueryFieldError) as info:
        db.query(**q)
    assert str(info.value).startswith("openai/gpt-oss-120b runs 2 kinds of layer on context_attention: sliding "
                                      "(18 layers), full (18 layers); give layer")
    sliding = db.query(**q, layer="sliding")
    full = db.query(**q, layer="full")
    assert (sliding.fields["window_size"], full.fields["window_size"]) == (128, 0)
    assert sliding.fields["head_dim"] == full.fields["head_dim"] == 64
    assert sliding.fields["num_key_value_heads"] == 1 and sliding.latency_ms < full.latency_ms
    # a field the user gives may pick the kind
    assert db.query(**q, window_size=128).latency_ms == sliding.latency_ms
    with pytest.raises(E.QueryFieldError, match="openai/gpt-oss-120b runs no 'chunked' layers on context_attention"):
        db.query(**q, layer="chunked")
    # GLM-5.2's shared-indexer layers run the *_skip_indexer rows
    glm = dict(table="dsa_context_module", system="h200_sxm", backend="sglang", version="0.5.14",
               model="zai-org/GLM-5.2", tp_size=8, batch_size=2, isl=1024)
    assert db.query(**glm, layer="shared_indexer").fields["op_name"] == "dsa_context_module_skip_indexer"
    assert db.query(**glm, layer="indexer").fields["op_name"] == "dsa_context_module"


# --- contradictions ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("query", "message"), [
    (dict(table="generation_attention", system="h200_sxm", backend="vllm", version="0.24.0",
          model="Qwen/Qwen3-32B", tp_size=2, batch_size=16, step=1023, num_key_value_heads=8),
     "num_key_value_heads=8 contradicts Qwen/Qwen3-32B at tp_size 2: rank-local kv heads are 4 (8 kv heads / tp 2)"),
    (dict(table="generation_attention", system="h200_sxm", backend="vllm", version="0.24.0",
          model="Qwen/Qwen3-32B", tp_size=2, batch_size=16, step=1023, head_dim=64),
     "head_dim=64 contradicts Qwen/Qwen3-32B at tp_size 2: its full layers use head_dim 128"),
    (dict(table="generation_attention", system="h200_sxm", backend="vllm", version="0.24.0",
          model="Qwen/Qwen3-32B", tp_size=2, batch_size=16, step=1023, window_size=4096),
     "window_size=4096 contradicts Qwen/Qwen3-32B at tp_size 2: its full layers use window_size 0"),
    (dict(table="dsv4_csa_context_module", system="b200_sxm", backend="sglang", version="0.5.14",
          model="deepseek-ai/DeepSeek-V4-Pro", tp_size=8, batch_size=1, isl=4096, compress_ratio=128),
     "compress_ratio=128 contradicts deepseek-ai/DeepSeek-V4-Pro at tp_size 8: its csa layers use compress_ratio 4"),
    # a dtype is the deployment's choice (answered below), but a model given with a dtype stays
    # the model: its kv heads at the tp still decide
    (dict(table="generation_attention", system="h200_sxm", backend="vllm", version="0.24.0",
          model="Qwen/Qwen3-32B", tp_size=2, batch_size=16, step=1023, num_key_value_heads=8, kv_cache_dtype="fp8"),
     "num_key_value_heads=8 contradicts Qwen/Qwen3-32B at tp_size 2: rank-local kv heads are 4 (8 kv heads / tp 2)"),
    (dict(table="dsa_context_module", system="h200_sxm", backend="sglang", version="0.5.14",
          model="deepseek-ai/DeepSeek-V3.2", tp_size=8, batch_size=4, isl=2048,
          op_name="dsa_context_module_skip_indexer"),
     "op_name=dsa_context_module_skip_indexer contradicts deepseek-ai/DeepSeek-V3.2 at tp_size 8: its indexer "
     "layers use op_name dsa_context_module"),
])
def test_a_contradiction_is_refused_naming_field_given_derived_and_why(db: modperf.Database, query: dict,
                                                                      message: str) -> None:
    with pytest.raises(E.ContradictionError) as info:
        db.query(**query)
    assert str(info.value).startswith(message)
    assert info.value.exit_code == 2 and info.value.kind == "contradiction"
    assert set(info.value.values) >= {"field", "given", "derived"}
    assert info.value.fix.startswith(f"leave {info.value.values['field']} out (the model fixes it)")


def test_a_given_dtype_wins_over_the_checkpoints(db: modperf.Database) -> None:
    """Issue 21: the table measured DeepSeek-V3 with bf16 GEMMs beside fp8_block ones (a backend
    serves either); a dtype is the deployment's choice, so the stored bf16 row answers, and the
    answer says what the checkpoint stores."""
    q = dict(table="mla_context_module", system="h200_sxm", backend="trtllm", version="1.3.0rc20",
             model="deepseek-ai/DeepSeek-V3", tp_size=8, batch_size=4, isl=2048)
    bf16 = db.query(**q, gemm_type="bfloat16")
    own = db.query(**q)
    assert (bf16.latency_ms, bf16.kind, own.latency_ms, own.kind) == (1.0667, "exact", 1.0389, "exact")
    where = dict(model="deepseek-ai/DeepSeek-V3", kernel_source="default", mla_dtype="bfloat16",
                 kv_cache_dtype="bfloat16", num_heads=16, batch_size=4, isl=2048, step=0)
    for answer, dtype in ((bf16, "bfloat16"), (own, "fp8_block")):
        assert answer.fields["gemm_type"] == dtype
        assert [answer.latency_ms] == stored(db, "h200_sxm", "trtllm", "1.3.0rc20", "mla_context_module",
                                             gemm_type=dtype, **where)
    assert bf16.derived == {"gemm_type": "bfloat16 as given (a deployment's choice); its checkpoint stores them as "
                                         "fp8_block (quantization_config: quant_method fp8, weight_block_size [128, "
                                         "128])"}
    assert own.derived == {"gemm_type": "its checkpoint stores its linear layers as fp8_block (quantization_config: "
                                        "quant_method fp8, weight_block_size [128, 128])"}
    # the checkpoint's own value given is the checkpoint's answer, and says so
    assert db.query(**q, gemm_type="fp8_block").derived == own.derived
    # the same choice spelled as the served variant
    variant = db.query(**{**q, "model": "deepseek-ai/DeepSeek-V3@gemm=bfloat16"})
    assert variant.latency_ms == bf16.latency_ms and variant.fields["gemm_type"] == "bfloat16"
    assert variant.derived["gemm_type"] == (
        "served with its linear layers as bfloat16 (deepseek-ai/DeepSeek-V3@gemm=bfloat16); its checkpoint stores "
        "them as fp8_block (quantization_config: quant_method fp8, weight_block_size [128, 128])")
    # a dtype the table never measured for this geometry is a miss naming the dtypes it did measure
    with pytest.raises(E.NotCoveredError) as info:
        db.query(**q, gemm_type="nvfp4")
    assert info.value.fix.startswith(
        "the table measured this key with gemm_type=fp8_block or gemm_type=bfloat16 (a dtype is the deployment's "
        "choice): give it (--gemm-type fp8_block); or use the values of a covered key")


def test_a_miss_a_served_dtype_would_fix_names_it(db: modperf.Database) -> None:
    """Issue 25: the table measured DeepSeek-V3 with bf16 and nvfp4 GEMMs, not its checkpoint's
    fp8_block: the miss names the dtypes measured, as the option and as the served variant, and
    that variant answers."""
    q = dict(table="mla_context_module", system="rtx_pro_6000_server", backend="vllm", version="0.24.0",
             model="deepseek-ai/DeepSeek-V3", tp_size=8, batch_size=1, isl=1024, kernel_source="FLASH_ATTN")
    with pytest.raises(E.NotCoveredError) as info:
        db.query(**q)
    assert info.value.fix.startswith(
        "the table measured this key with gemm_type=bfloat16 or gemm_type=nvfp4 (a dtype is the deployment's "
        "choice): give it (--gemm-type bfloat16), or ask for the served variant "
        "deepseek-ai/DeepSeek-V3@gemm=bfloat16,moe=fp8_block; or use the values of a covered key")
    served = db.query(**{**q, "model": "deepseek-ai/DeepSeek-V3@gemm=bfloat16,moe=fp8_block"})
    assert served.kind == "exact" and served.latency_ms == db.query(**q, gemm_type="bfloat16").latency_ms
    assert [served.latency_ms] == stored(db, "rtx_pro_6000_server", "vllm", "0.24.0", "mla_context_module",
                                         model="deepseek-ai/DeepSeek-V3", gemm_type="bfloat16",
                                         kernel_source=served.fields["kernel_source"], mla_dtype="bfloat16",
                                         kv_cache_dtype="bfloat16", num_heads=16, batch_size=1, isl=1024, step=0)
    # the CLI, as a user runs it
    run = run_cli(["query", "mla_context_module", "--system", "rtx_pro_6000_server", "--backend", "vllm", "--version",
                   "0.24.0", "--model", "deepseek-ai/DeepSeek-V3", "--tp", "8", "--batch-size", "1", "--isl", "1024",
                   "--kernel-source", "FLASH_ATTN", "--json"])
    assert run.returncode == 1
    error = json.loads(run.stdout)["error"]
    assert error["kind"] == "not_covered" and "deepseek-ai/DeepSeek-V3@gemm=bfloat16,moe=fp8_block" in error["fix"]


def test_num_heads_and_native_heads_that_contradict_the_model(db: modperf.Database) -> None:
    q = dict(table="generation_attention", system="h200_sxm", backend="vllm", version="0.24.0",
             model="Qwen/Qwen3-32B", batch_size=16, step=1023)
    with pytest.raises(E.ShardError, match=r"num_heads=16 contradicts native 64 / tp_size 2 = 32"):
        db.query(**q, tp_size=2, num_heads=16)
    with pytest.raises(E.QueryFieldError, match=r"native_heads=32 contradicts model Qwen/Qwen3-32B"):
        db.query(**q, tp_size=2, native_heads=32)


# --- lanes ------------------------------------------------------------------------------------------


def test_the_sglang_dsa_context_lane_boundary(db: modperf.Database) -> None:
    q = dict(table="dsa_context_module", system="h200_sxm", backend="sglang", version="0.5.14",
             model="deepseek-ai/DeepSeek-V3.2", tp_size=8, batch_size=4)
    at = db.query(**q, isl=1024, step=1024)  # isl + prefix = 2048 = index_topk: dense
    past = db.query(**q, isl=1024, step=1025)  # 2049: the indexer lane of the bf16 KV cache
    assert at.lane["kernel_source"] == "sglang_dsa_dense_mha_fa3"
    assert past.lane == {"kernel_source": "sglang_dsa_indexer_flashmla_sparse",
                         "rule": "isl + step > index_topk (2048): SGLang runs the indexer lane of this KV dtype"}
    fp8 = db.query(**q, isl=4096, kv_cache_dtype="fp8")
    assert fp8.lane["kernel_source"] == "sglang_dsa_indexer_flashmla_kv"
    # a lane named explicitly is honoured, labelled as any answer outside its measured range
    named = db.query(**q, isl=2048, kernel_source="sglang_dsa_indexer_flashmla_sparse")
    assert named.lane is None and named.kind == "extrapolated"
    assert named.latency_ms == pytest.approx(5.38, abs=0.01) and named.latency_ms > 6 * at.latency_ms
    # vectorised: each point answered from its own lane, the same numbers as the single queries
    lat, kinds = db.query_many(**q, isl=[1024, 1024, 2048, 4096], step=[1024, 1025, 0, 0])
    singles = [db.query(**q, isl=i, step=s).latency_ms for i, s in ((1024, 1024), (1024, 1025), (2048, 0), (4096, 0))]
    assert lat.tolist() == pytest.approx(singles, rel=1e-12)


def test_overlapping_lanes_without_a_rule_still_list_the_kernels(db: modperf.Database) -> None:
    with pytest.raises(E.QueryFieldError) as info:
        db.query(table="dsa_generation_module", system="h200_sxm", backend="sglang", version="0.5.14",
                 model="zai-org/GLM-5.2", layer="shared_indexer", tp_size=8, batch_size=8, step=4095)
    assert info.value.values["values"] == ["sglang_dsa_skip_indexer_fa3", "sglang_dsa_skip_indexer_flashmla_kv"]


# --- answers that say what they are -----------------------------------------------------------------


def test_substitution_is_flagged_in_json_and_text(db: modperf.Database) -> None:
    q = dict(table="mla_context_module", system="gb300", backend="vllm", version="0.27.0", kernel_source="FLASH_ATTN",
             mla_dtype="bfloat16", kv_cache_dtype="bfloat16", gemm_type="bfloat16", batch_size=4, isl=1024)
    exact = db.query(**q, native_heads=96, num_heads=8)
    substituted = db.query(**q, native_heads=64, tp_size=8, allow_substitute=True)
    assert (substituted.substituted_from, exact.substituted_from) == (96, None)
    assert substituted.to_dict()["substituted_from"] == 96 and substituted.latency_ms == exact.latency_ms
    args = ["query", "mla_context_module", "--system", "gb300", "--backend", "vllm", "--version", "0.27.0",
            "--native-heads", "64", "--tp", "8", "--kernel-source", "FLASH_ATTN", "--mla-dtype", "bfloat16",
            "--kv-cache-dtype", "bfloat16", "--gemm-type", "bfloat16", "--batch-size", "4", "--isl", "1024",
            "--allow-substitute"]
    text = runner.invoke(app, args)
    assert text.exit_code == 0 and "SUBSTITUTED: answered from native bucket 96, not the native asked (64)" in text.stdout


def test_native_heads_says_the_geometry_was_not_checked(db: modperf.Database) -> None:
    a = db.query(table="mla_context_module", system="gb300", backend="vllm", version="0.27.0", native_heads=128,
                 tp_size=8, batch_size=4, isl=2048, kernel_source="FLASH_ATTN")
    assert a.notes == ["native_heads names no model: the bucket's module geometry could not be checked against "
                       "yours (give model to check it)"]


def test_the_msa_outlier_answer_carries_its_quality_finding(db: modperf.Database) -> None:
    q = dict(table="msa_context_module", system="h200_sxm", backend="trtllm", version="1.3.0rc23",
             model="nvidia/MiniMax-M3-NVFP4", tp_size=1, batch_size=2, step=128, gemm_type="fp8_block")
    a = db.query(**q, isl=32768)
    assert (a.latency_ms, a.kind) == (38810.9193, "exact")
    (finding,) = a.quality
    assert finding["kind"] == "cross_file" and finding["reference"] == 50.0566
    assert finding["others"] == [{"file": "h200_sxm/msa/vllm/0.24.0/msa_context_module", "latency": 50.0566}]
    # an interpolated answer lists the findings of the corners it blends
    between = db.query(**q, isl=30000)
    assert between.kind == "interpolated"
    assert sorted(f["point"]["isl"] for f in between.quality) == [16384, 32768]
    # the mixed-precision checkpoint fixes no GEMM dtype: the answer says so beside the one given
    assert a.derived["gemm_type"] == ("fp8_block as given (a deployment's choice); its checkpoint does not fix them "
                                      "(quantization_config: modelopt does not fix one dtype per kind of layer)")
    without = db.query(**{k: v for k, v in q.items() if k != "gemm_type"}, isl=32768)
    assert "gemm_type not derived: quantization_config: modelopt does not fix one dtype per kind of layer" in \
        without.notes
    text = runner.invoke(app, ["query", "msa_context_module", "--system", "h200_sxm", "--backend", "trtllm",
                               "--version", "1.3.0rc23", "--model", "nvidia/MiniMax-M3-NVFP4", "--tp", "1",
                               "--batch-size", "2", "--isl", "32768", "--step", "128", "--gemm-type", "fp8_block"])
    assert "QUALITY: 1 finding(s)" in text.stdout and "cross_file" in text.stdout
    # a clean point carries none
    assert db.query(table="mla_context_module", system="gb300", backend="vllm", version="0.27.0",
                    model="moonshotai/Kimi-K3", tp_size=8, batch_size=4, isl=2048,
                    kernel_source="FLASH_ATTN").quality is None


def test_unknown_names_get_the_nearest(db: modperf.Database) -> None:
    with pytest.raises(E.UnknownModelError) as info:
        db.query(table="generation_attention", system="h200_sxm", backend="vllm", model="Qwen3-32B", tp_size=2,
                 batch_size=16, step=1023)
    assert info.value.fix.startswith("did you mean Qwen/Qwen3-32B?")
    with pytest.raises(E.UnknownTableError, match="did you mean system h200_sxm"):
        db.query(table="generation_attention", system="h200", backend="vllm", version="0.24.0", num_heads=8,
                 batch_size=1, step=1023)


# --- the resolution itself ----------------------------------------------------------------------------


def test_derive_reads_the_schedule_and_the_checkpoint(models: ModelRegistry) -> None:
    from modperf.data.families import registry

    gqa = registry()["gqa"]
    keys = {"num_key_value_heads", "head_dim", "window_size", "attn_dtype", "kv_cache_dtype"}
    mimo = models.get("XiaomiMiMo/MiMo-V2-Flash")
    kinds = {k.name: n for k, n in layer_kinds(mimo, "context_attention", "context")}
    assert kinds == {"full": 9, "sliding": 39}
    d = derive(mimo, gqa, "context_attention", "context", keys, tp=4, layer="sliding")
    assert (d.native, d.local) == (mimo.get("swa_num_attention_heads"), mimo.get("swa_num_attention_heads") // 4)
    assert d.fields == {"head_dim": mimo.get("swa_head_dim"), "window_size": mimo.get("sliding_window_size"),
                        "num_key_value_heads": mimo.get("swa_num_key_value_heads") // 4}


def test_checkpoint_quantization(models: ModelRegistry) -> None:
    cases = {
        "deepseek-ai/DeepSeek-V3": ("fp8_block", "fp8_block"),
        "Qwen/Qwen3-32B": ("bfloat16", "bfloat16"),
        "Qwen/Qwen3-32B-FP8-Static-PerTensor": ("fp8", "fp8"),
        "nvidia/DeepSeek-V3.1-NVFP4": ("nvfp4", "nvfp4"),
        "openai/gpt-oss-120b": ("bfloat16", "w4a16_mxfp4"),
        "moonshotai/Kimi-K2.5": ("bfloat16", "int4_wo"),
        "moonshotai/Kimi-K3": ("bfloat16", "w4a16_mxfp4"),
        "nvidia/MiniMax-M3-NVFP4": (None, None),
    }
    for model, (gemm, moe) in cases.items():
        q = models.get(model).quantization
        assert (q.gemm, q.moe) == (gemm, moe), model


def test_stale_two_chain_kernel_table_is_rejected_then_migrated(db: modperf.Database, tmp_path: Path) -> None:
    """A local-only table with a 64- and a 128-native chain stored the old way (num_heads :=
    num_heads * tp, constant over tp in each chain) passed `check` before the per-chain guard."""
    from modperf.audit.migrate import migrate

    source = pq.read_table(db.ref("a100_sxm", "trtllm", "1.0.0", "context_mla").path)
    stale = source.set_column(source.column_names.index("num_heads"), "num_heads",
                              pc.multiply(source.column("num_heads"), source.column("tp_size")))
    folder = tmp_path / "a100_sxm" / "mla" / "trtllm" / "1.0.0"
    folder.mkdir(parents=True)
    path = folder / "context_mla_perf.parquet"
    pq.write_table(stale, path)
    report = modperf.check([str(path)])
    (failure,) = report.failures
    assert type(failure) is E.StaleConventionError and failure.row_count == 2436
    assert failure.values == {"num_heads": [64, 128], "tp_sizes": [1, 2, 4, 8, 16, 32, 64]}
    assert failure.fix.startswith(f"run `modperf migrate {path}`")
    plan = migrate([path]).files[0]
    assert (plan.pattern, plan.action, plan.rows_changed) == ("stale_native", "rewrite", 2088)
    assert [(g.native, g.num_heads_after[8]) for g in plan.groups] == [(64, 8), (128, 16)]
    assert migrate([path], execute=True).ok
    assert pq.read_table(path).equals(source)  # the rank-local original, exactly
    assert modperf.check([str(path)]).ok


def test_a_served_variant_names_its_dtypes(db: modperf.Database) -> None:
    """``ORG/NAME@DTYPE``: one geometry served in other dtypes than its checkpoint's."""
    q = dict(table="mla_context_module", system="gb300", backend="vllm", version="0.27.0", kernel_source="FLASH_ATTN",
             mla_dtype="bfloat16", kv_cache_dtype="bfloat16", tp_size=4, batch_size=4, isl=2048)
    nvfp4 = db.query(**q, model="deepseek-ai/DeepSeek-V3@nvfp4")
    bf16 = db.query(**q, model="deepseek-ai/DeepSeek-V3@gemm=bfloat16")
    assert (nvfp4.fields["gemm_type"], bf16.fields["gemm_type"]) == ("nvfp4", "bfloat16")
    assert [nvfp4.latency_ms] == stored(db, "gb300", "vllm", "0.27.0", "mla_context_module",
                                        model="deepseek-ai/DeepSeek-V3", gemm_type="nvfp4", kernel_source="FLASH_ATTN",
                                        mla_dtype="bfloat16", kv_cache_dtype="bfloat16", num_heads=32, batch_size=4,
                                        isl=2048)
    assert bf16.latency_ms == 0.7654 and nvfp4.models == ("deepseek-ai/DeepSeek-V3",)
    assert nvfp4.derived["gemm_type"] == (
        "served with its linear layers as nvfp4 (deepseek-ai/DeepSeek-V3@nvfp4); its checkpoint stores them as "
        "fp8_block (quantization_config: quant_method fp8, weight_block_size [128, 128])")
    with pytest.raises(E.UnknownModelError, match="cannot read the served-dtype suffix"):
        db.query(**q, model="deepseek-ai/DeepSeek-V3@fp8=oops,=")
