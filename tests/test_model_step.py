"""The whole model's step (modperf.model.step) on the embedded corpus: per-op values at grid
points equal the stored rows (read with pyarrow here), totals and components equal the ops
summed here, tp adds communication, MoE models carry a moe component, a mixed step prices its
GEMMs at the summed tokens, an op no table covers makes the total partial, and a table written
in the other convention is rejected through step_cost with the fix."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tests.helpers import column, set_col, stored_latency, variant

import modperf
from modperf import errors as E
from modperf.model.step import COMPONENTS, DecodePart, Parallel, SeqChunk, StepCost, step_cost

V3 = dict(model="deepseek-ai/DeepSeek-V3", system="h200_sxm", backend="vllm")
LLAMA = dict(model="meta-llama/Meta-Llama-3.1-70B", system="h200_sxm", backend="vllm")
#: Tables whose stored latency column is in ms and whose keys are stored under their own names.
PLAIN = ("gemm", "moe", "custom_allreduce", "nccl")


def summed(step: StepCost) -> float:
    return math.fsum(op.ms * op.count for op in step.ops)


def test_ops_at_grid_points_equal_the_stored_rows(db: modperf.Database) -> None:
    step = step_cost(db, **V3, parallel=Parallel(tp=8), decode=DecodePart(batch=4, kv=2560))
    # Llama's hidden 8192 x 4 tokens is a stored message size of the all-reduce table
    llama = step_cost(db, **LLAMA, parallel=Parallel(tp=8), decode=DecodePart(batch=4, kv=2560))
    checked = set()
    for one in (step, llama):
        for op in one.ops:
            if op.kind != "exact" or op.table not in PLAIN:
                continue
            path = db.ref(one.system, op.backend, op.version, op.table).path
            names = set(pq.read_schema(path).names)
            where = {k: v for k, v in op.fields.items() if k in names}
            assert op.ms == stored_latency(path, where), op.name
            checked.add(op.table)
    assert {"gemm", "moe", "custom_allreduce"} <= checked
    moe = next(op for op in step.ops if op.name == "L3-60 moe experts")
    # the moe table's convention (docs/families.md): global inter_size, experts and group tokens
    assert (moe.fields["inter_size"], moe.fields["num_experts"], moe.fields["num_tokens"],
            moe.fields["moe_tp_size"], moe.fields["moe_ep_size"]) == (2048, 256, 4, 8, 1)
    assert moe.fields["moe_dtype"] == "fp8_block" and moe.count == 58


def test_totals_and_components_are_the_ops_summed(db: modperf.Database) -> None:
    for kw in (dict(prefill=SeqChunk(2, 1024)), dict(decode=DecodePart(8, 1500))):
        step = step_cost(db, **V3, parallel=Parallel(tp=4), **kw)
        assert step.complete and list(step.components) == list(COMPONENTS)
        assert step.total_ms == pytest.approx(summed(step), rel=1e-12)
        assert math.fsum(step.components.values()) == pytest.approx(step.total_ms, rel=1e-12)
        for comp in COMPONENTS:
            assert step.components[comp] == pytest.approx(
                math.fsum(op.ms * op.count for op in step.ops if op.component == comp), rel=1e-12)
        assert {op.kind for op in step.ops} <= {"exact", "interpolated", "extrapolated", "roofline"}
        doc = step.to_dict()
        assert doc["total_ms"] == step.total_ms and doc["complete"] is True and len(doc["ops"]) == len(step.ops)


def test_tp_adds_communication_and_moe_models_carry_moe(db: modperf.Database) -> None:
    one = step_cost(db, **LLAMA, parallel=Parallel(tp=1), decode=DecodePart(8, 2048))
    eight = step_cost(db, **LLAMA, parallel=Parallel(tp=8), decode=DecodePart(8, 2048))
    assert one.components["communication"] == 0 and not any(op.component == "communication" for op in one.ops)
    allreduce = next(op for op in eight.ops if op.name == "tp allreduce")
    # after every attention block and every MLP, and once for the vocab-parallel embedding
    assert allreduce.count == 2 * 80 + 1 and allreduce.fields["num_gpus"] == 8
    assert allreduce.fields["message_size"] == 8 * 8192 and allreduce.table == "custom_allreduce"
    assert eight.components["communication"] > 0
    assert one.components["moe"] == 0 and eight.components["moe"] == 0
    v3 = step_cost(db, **V3, parallel=Parallel(tp=8), decode=DecodePart(8, 2048))
    assert v3.components["moe"] > 0


def test_a_mixed_step_prices_token_linear_ops_at_the_summed_tokens(db: modperf.Database) -> None:
    par = Parallel(tp=2)
    mixed = step_cost(db, **LLAMA, parallel=par, prefill=SeqChunk(1, 512, prefix=256), decode=DecodePart(16, 3000))
    gate_up = next(op for op in mixed.ops if op.name == "L0-79 mlp gate_up")
    assert gate_up.fields["m"] == 512 + 16 and gate_up.fields["n"] == 2 * 28672 // 2
    names = [op.name for op in mixed.ops]
    assert "L0-79 gqa attention (prefill)" in names and "L0-79 gqa attention (decode)" in names
    prefill = next(op for op in mixed.ops if op.name == "L0-79 gqa attention (prefill)")
    assert (prefill.fields["batch_size"], prefill.fields["isl"], prefill.fields["step"]) == (1, 512, 256)
    direct = db.query(table="gemm", system="h200_sxm", backend="vllm", version=gate_up.version,
                      kernel_source=gate_up.fields["kernel_source"], gemm_dtype="bfloat16", m=528, n=28672, k=8192)
    assert gate_up.ms == direct.latency_ms


def test_an_op_no_table_covers_makes_the_total_partial(db: modperf.Database) -> None:
    step = step_cost(db, model="Qwen/Qwen3.5-397B-A17B", system="a100_sxm", backend="vllm",
                     parallel=Parallel(tp=8), decode=DecodePart(4, 2048))
    assert step.total_ms is None and not step.complete
    gdn = [m for m in step.not_covered if m["table"] == "gdn"]
    assert [m["name"] for m in gdn] == ["L0-2,4-6,8-10,... (45 layers) gdn conv (decode)",
                                        "L0-2,4-6,8-10,... (45 layers) gdn recurrence (decode)"]
    assert gdn[0]["reason"].startswith("no a100_sxm/vllm version holds a gdn table")
    op = next(op for op in step.ops if op.ms is None)
    assert op.kind == "not_covered" and op.count == 45
    assert step.components["gemm"] > 0  # the covered ops still count
    ep = Parallel(tp=1, attention_dp=8, moe_ep=8)
    # 65,536 tokens to the experts, past what the grid answers: two parts of 32,768 (additive)
    split = next(op for op in step_cost(db, **V3, parallel=ep, prefill=SeqChunk(4, 2048)).ops
                 if op.name == "L3-60 moe experts")
    half = next(op for op in step_cost(db, **V3, parallel=ep, prefill=SeqChunk(2, 2048)).ops
                if op.name == "L3-60 moe experts")
    assert split.fields["split"] == "2 x num_tokens" and half.fields["num_tokens"] == 32768
    assert split.ms == 2 * half.ms
    # past what 16 parts reach: not covered, and the total is partial
    too_long = step_cost(db, **V3, parallel=ep, prefill=SeqChunk(64, 4096))
    experts = next(op for op in too_long.ops if op.name == "L3-60 moe experts")
    assert experts.ms is None and experts.fields["num_tokens"] == 8 * 64 * 4096
    assert "beyond the extrapolation limit" in experts.reason and too_long.total_ms is None


def test_expert_parallel_adds_dispatch_and_combine(db: modperf.Database) -> None:
    step = step_cost(db, **V3, parallel=Parallel(tp=1, attention_dp=8, moe_ep=8), decode=DecodePart(4, 2560))
    dispatch = next(op for op in step.ops if op.name == "L3-60 moe dispatch")
    assert dispatch.table == "moe_a2a" and dispatch.component == "communication"
    assert dispatch.fields["comm_backend"] == "deepep_ll" and dispatch.fields["num_tokens"] == 4
    path = db.ref("h200_sxm", "vllm", dispatch.version, "moe_a2a").path
    names = set(pq.read_schema(path).names)
    if dispatch.kind == "exact":  # stored in µs: the loader converts to ms
        assert dispatch.ms == stored_latency(path, {k: v for k, v in dispatch.fields.items() if k in names}) / 1000
    experts = next(op for op in step.ops if op.name == "L3-60 moe experts")
    assert (experts.fields["num_tokens"], experts.fields["moe_tp_size"], experts.fields["moe_ep_size"]) == (32, 1, 8)


def test_mxfp4_experts_run_on_the_backends_default_kernel_for_the_gpu(db: modperf.Database) -> None:
    """gpt-oss's mxfp4 experts on TRT-LLM: its TRTLLM MoE backend (mxfp8 activations) on
    Blackwell, TRITON (bfloat16 activations) on Hopper, as its deployment guide says; each
    answer is the stored row of that kernel's table."""
    for system, kernel, name in (("b200_sxm", "w4a8_mxfp4_mxfp8", "L0-35 moe experts (w4a8_mxfp4_mxfp8 kernel)"),
                                 ("h200_sxm", "w4a16_mxfp4", "L0-35 moe experts")):
        step = step_cost(db, model="openai/gpt-oss-120b", system=system, backend="trtllm", parallel=Parallel(tp=1),
                         decode=DecodePart(8, 2048))
        experts = next(op for op in step.ops if op.component == "moe")
        assert (experts.name, experts.fields["moe_dtype"]) == (name, kernel)
        assert experts.kind == "exact"
        path = db.ref(system, "trtllm", experts.version, "moe").path
        names = set(pq.read_schema(path).names)
        assert experts.ms == stored_latency(path, {k: v for k, v in experts.fields.items() if k in names})


def test_trtllm_caps_a_moe_models_dense_mlp_tp(db: modperf.Database) -> None:
    """TRT-LLM runs DeepSeek-V3's shared experts and dense layers at gcd(inter / block, tp)
    within one node (its _compute_shared_expert_tp_size / _compute_mlp_tp_size): fp8_block
    blocks of 128 give gcd(2048 / 128, 32) = 16 for the shared expert, above h200's 8 GPUs per
    node, so 8 (k = 2048 / 8); the dense layers gcd(18432 / 128, 32) = 16 -> 8 as well. vLLM
    shards them over all 32 ranks."""
    par = Parallel(tp=32, moe_tp=32)
    downs = {}
    for backend in ("trtllm", "vllm"):
        pricer_step = step_cost(db, model="deepseek-ai/DeepSeek-V3", system="h200_sxm", backend=backend,
                                parallel=par, decode=DecodePart(8, 2048))
        downs[backend] = {op.name: op.fields.get("k") for op in pricer_step.ops if op.name.endswith(" down")}
    assert downs["trtllm"] == {"L0-2 mlp down": 18432 // 8, "L3-60 moe shared expert down": 2048 // 8}
    assert downs["vllm"] == {"L0-2 mlp down": 18432 // 32, "L3-60 moe shared expert down": 2048 // 32}


def test_parallel_is_validated() -> None:
    assert Parallel(tp=4, attention_dp=2, moe_ep=4).moe_tp == 2
    assert Parallel(tp=8) == Parallel(tp=8, moe_tp=8, moe_ep=1)
    with pytest.raises(E.OptionValueError, match=r"moe_tp x moe_ep = 4 must equal tp x attention_dp = 8"):
        Parallel(tp=8, moe_tp=4)
    with pytest.raises(E.OptionValueError, match=r"moe_ep=3 does not divide") as exc:
        Parallel(tp=8, moe_ep=3)
    assert exc.value.fix == "use a moe_ep that divides 8: 1, 2, 4, 8"
    with pytest.raises(E.OptionValueError):
        Parallel(tp=0)


def test_shard_and_request_errors(db: modperf.Database) -> None:
    with pytest.raises(E.ShardError, match="tp=5 does not divide deepseek-ai/DeepSeek-V3's native head count 128"):
        step_cost(db, **V3, parallel=Parallel(tp=5), decode=DecodePart(1, 10))
    with pytest.raises(E.UsageError, match="a step needs a prefill chunk, a decode part or both"):
        step_cost(db, **V3, parallel=Parallel(tp=8))
    with pytest.raises(E.UsageError, match="decode.batch must be an integer"):
        step_cost(db, **V3, parallel=Parallel(tp=8), decode=DecodePart(0, 10))


def test_hybrid_linear_attention_layers_come_from_gdn(db: modperf.Database) -> None:
    step = step_cost(db, model="Qwen/Qwen3.5-397B-A17B", system="h200_sxm", backend="sglang",
                     parallel=Parallel(tp=8), decode=DecodePart(4, 2048))
    conv = next(op for op in step.ops if op.name.endswith("gdn conv (decode)"))
    rule = next(op for op in step.ops if op.name.endswith("gdn recurrence (decode)"))
    assert conv.table == rule.table == "gdn" and conv.count == rule.count == 45
    assert "conv1d" in conv.fields["kernel_source"] and "conv1d" not in rule.fields["kernel_source"]
    assert (conv.fields["num_k_heads"], conv.fields["num_v_heads"]) == (16 // 8, 64 // 8)
    assert step.complete


def test_a_table_in_the_other_convention_is_rejected_through_step_cost(db: modperf.Database,
                                                                     tmp_path: Path) -> None:
    def per_rank_inter(t):
        inter, tp = column(t, "inter_size"), column(t, "moe_tp_size")
        import pyarrow as pa

        t = t.filter(pa.array((inter // tp) % tp == 0))
        return set_col(t, "inter_size", column(t, "inter_size") // column(t, "moe_tp_size"))

    variant(db, tmp_path, ("a100_sxm", "trtllm", "1.0.0", "moe"), per_rank_inter)
    rewritten = modperf.open(tmp_path)
    with pytest.raises(E.TableRejectedError) as exc:
        step_cost(rewritten, model="Qwen/Qwen3-30B-A3B", system="a100_sxm", backend="trtllm",
                  parallel=Parallel(tp=2), decode=DecodePart(8, 1024))
    (failure,) = exc.value.failures
    assert isinstance(failure, E.ConventionError) and "inter_size looks per-rank" in str(failure)
    assert failure.fix.startswith("store the model's per-expert inter_size (the config's moe_intermediate_size)")


def test_warm_plans_are_reused(db: modperf.Database) -> None:
    from modperf.model.step import plan_for

    a = plan_for(db, **V3, parallel=Parallel(tp=8))
    assert plan_for(db, **V3, parallel=Parallel(tp=8, moe_tp=8)) is a
    assert plan_for(db, **V3, parallel=Parallel(tp=4)) is not a
