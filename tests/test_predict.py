"""modperf.serving.predict on real tables: a small deployment whose TTFT and TPOT this test computes by
hand from the whole-model steps, the served dtypes, memory, and the typed refusals."""

from __future__ import annotations

import math

import pytest

import modperf
from modperf import errors as E
from modperf.model.step import DecodePart, Parallel, SeqChunk, step_cost
from modperf.serving import Constants
from modperf.serving.predict import (
    deployment_from_row,
    kv_bytes_per_token,
    predict,
    price,
    served_dtypes,
    weight_bytes_per_gpu,
)

QWEN = dict(model_path="Qwen/Qwen3-32B", system="h200_sxm", backend="vllm", mode="agg")


def test_two_users_by_hand_from_the_steps(db: modperf.Database) -> None:
    """Qwen3-32B on h200 vllm at tp 2, 2 users, isl 1024, osl 11, physics only. The steps, each
    from step_cost: p1 one prefill, P2 the two prefills packed in one step (vLLM's 8192-token
    budget holds both), t_d a decode of 2 at kv 1024 + 5. With W = P2 / 2 and R = osl - 1, the
    closed loop X = 2 / (p1 + (R + 1/2) T), U = X W / 2, T = t_d / (1 - U) gives
    (R + 1/2) T^2 + (p1 - W - t_d (R + 1/2)) T - t_d p1 = 0; TTFT = p1 + T / 2."""
    par = Parallel(tp=2)
    common = dict(model="Qwen/Qwen3-32B", system="h200_sxm", backend="vllm", parallel=par)
    p1 = step_cost(db, **common, prefill=SeqChunk(1, 1024)).total_ms
    p2 = step_cost(db, **common, prefill=SeqChunk(2, 1024)).total_ms
    td = step_cost(db, **common, decode=DecodePart(2, 1024 + 5)).total_ms
    assert p1 and p2 and td
    w, r = p2 / 2, 10
    a, b, c = r + 0.5, p1 - w - td * (r + 0.5), -td * p1
    tpot = (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
    out = predict(db, deployment_from_row({**QWEN, "isl": 1024, "osl": 11, "batch_size": 2, "tp_size": 2}),
                  fitted=False)
    assert out.tpot_ms == pytest.approx(tpot, rel=1e-9)
    assert out.ttft_ms == pytest.approx(p1 + tpot / 2, rel=1e-9)
    assert out.steps["prefill_one"]["ms"] == p1 and out.steps["decode"]["ms"] == td
    assert out.serving["capacity_bound"] is False and out.serving["admission_wait_ms"] == 0.0
    assert out.gpus == 2 and out.tokens_per_s_per_user == pytest.approx(1000 / tpot)
    assert out.serving["constants"]["source"] == "physics only: no fitted constants"
    assert out.provenance["versions"]["gemm"] == "0.24.0"


def test_fitted_constants_are_the_backends(db: modperf.Database) -> None:
    from modperf.serving import BACKENDS

    dep = deployment_from_row({**QWEN, "isl": 1024, "osl": 128, "batch_size": 8, "tp_size": 2})
    out = predict(db, dep)
    assert out.serving["constants"]["s_dec"] == BACKENDS["vllm"].constants("agg", "h200_sxm")[0].s_dec
    assert out.serving["constants"]["source"].startswith("fitted")
    physics = predict(db, dep, fitted=False)
    assert out.tpot_ms != physics.tpot_ms


def test_served_dtypes_follow_the_checkpoint_layout() -> None:
    # fp8 named on a block-scaled fp8 checkpoint is its layout
    assert served_dtypes("fp8_block", "fp8_block", "fp8", "fp8")[:2] == ("fp8_block", "fp8_block")
    # a 4-bit re-quantization of an fp8 checkpoint is taken as named
    assert served_dtypes("fp8_block", "fp8_block", "nvfp4", "nvfp4")[:2] == ("nvfp4", "nvfp4")
    # an experts-only 4-bit checkpoint keeps its dense layers when the deployment names 4 bits
    gemm, moe, notes = served_dtypes("bfloat16", "w4a16_mxfp4", "nvfp4", "nvfp4")
    assert (gemm, moe) == ("bfloat16", "w4a16_mxfp4")
    assert notes == ["gemm dtype nvfp4 named; the checkpoint stores these weights as bfloat16 (served as such)",
                     "moe dtype nvfp4 named; the checkpoint stores these weights as w4a16_mxfp4 (served as such)"]
    # a bf16 checkpoint served in fp8
    assert served_dtypes("bfloat16", "bfloat16", "fp8", None)[:2] == ("fp8", "bfloat16")


def test_memory_from_the_config(db: modperf.Database) -> None:
    """Qwen3-32B: 64 layers of GQA (64 heads, 8 kv heads, head_dim 128), bf16 KV: 2 x 8 x 128
    x 2 bytes per layer at tp 1, one kv head per rank from tp 8 on."""
    cfg = db.models.get("Qwen/Qwen3-32B")
    assert kv_bytes_per_token(cfg, 1, 2048) == 2 * 8 * 128 * 2 * 64
    assert kv_bytes_per_token(cfg, 16, 2048) == 2 * 1 * 128 * 2 * 64
    dep = deployment_from_row({**QWEN, "isl": 1024, "osl": 128, "batch_size": 8, "tp_size": 2})
    assert dep.pool is not None
    weights = weight_bytes_per_gpu(cfg, dep.pool)
    assert 30e9 < weights < 34e9  # about 32.8 B parameters in bf16, over 2 GPUs
    priced = price(db, dep)
    assert priced.memory["kv_bytes_per_token"] == 2 * 4 * 128 * 2 * 64


def test_requests_beyond_the_kv_cache_queue_for_admission(db: modperf.Database) -> None:
    """Qwen3-32B's 65 GB of bf16 weights leave little room on one 80 GiB h100: 1,024 users of
    9k tokens cannot all run; the rest wait, so TTFT grows by whole request cycles."""
    dep = deployment_from_row({**QWEN, "system": "h100_sxm", "isl": 8192, "osl": 1024, "batch_size": 1024,
                               "tp_size": 1})
    out = predict(db, dep, fitted=False)
    running = out.serving["memory"]["max_running"]
    assert 1 <= running < 1024 and out.serving["waiting"] == 1024 - running
    assert out.serving["admission_wait_ms"] > 0


def test_bad_deployments_are_typed(db: modperf.Database) -> None:
    with pytest.raises(E.UnknownTableError, match="did you mean system h200_sxm"):
        price(db, deployment_from_row({**QWEN, "system": "h200", "isl": 8, "osl": 8, "batch_size": 1, "tp_size": 1}))
    with pytest.raises(E.ShardError, match="tp=3 does not divide Qwen/Qwen3-32B's native head count 64"):
        price(db, deployment_from_row({**QWEN, "isl": 8, "osl": 8, "batch_size": 1, "tp_size": 3}))
    with pytest.raises(E.QueryFieldError, match=r"batch_size must be an integer in 1\.\.1,048,576"):
        deployment_from_row({**QWEN, "isl": 8, "osl": 8, "batch_size": -4, "tp_size": 1})
    with pytest.raises(E.QueryFieldError, match="a disaggregated deployment needs decode_batch_size"):
        deployment_from_row({**QWEN, "mode": "disagg", "isl": 8, "osl": 8, "prefill_tp_size": 1,
                             "decode_tp_size": 1})
    with pytest.raises(E.QueryFieldError, match="unknown field"):
        deployment_from_row({**QWEN, "isl": 8, "osl": 8, "batch_size": 1, "tp_size": 1, "tp": 2})
    with pytest.raises(E.UnknownModelError, match="did you mean Qwen/Qwen3-32B"):
        price(db, deployment_from_row({**QWEN, "model_path": "Qwen3-32B", "isl": 8, "osl": 8, "batch_size": 1,
                                       "tp_size": 1}))


def test_disaggregated_pools(db: modperf.Database) -> None:
    """The decode pool sets TPOT (physics only: its decode step), the prefill pool TTFT."""
    row = {**QWEN, "mode": "disagg", "isl": 1024, "osl": 64, "prefill_tp_size": 2, "prefill_num_workers": 1,
           "decode_tp_size": 2, "decode_num_workers": 2, "decode_batch_size": 8}
    out = predict(db, deployment_from_row(row), fitted=False)
    td = step_cost(db, model="Qwen/Qwen3-32B", system="h200_sxm", backend="vllm", parallel=Parallel(tp=2),
                   decode=DecodePart(8, 1024 + 32)).total_ms
    assert out.tpot_ms == td
    assert out.serving["concurrency"] == 16 and out.gpus == 6
    assert out.ttft_ms >= out.steps["prefill_one"]["ms"] + out.serving["kv_transfer_ms"]


def test_constants_default_to_physics() -> None:
    assert Constants() == Constants(1.0, 1.0, 0.0, 0.0, 0.0, 0.5)


def test_pipeline_stages_split_the_batch_and_add_hops(db: modperf.Database) -> None:
    """pp 2 (formula only: no measured row has pp > 1): each micro-batch carries half the users
    through every layer, plus one peer-to-peer hop (system yaml: 10 us on h200)."""
    row = {**QWEN, "isl": 1024, "osl": 128, "batch_size": 8, "tp_size": 2}
    one = price(db, deployment_from_row(row))
    two = price(db, deployment_from_row({**row, "pp_size": 2}))
    td = step_cost(db, model="Qwen/Qwen3-32B", system="h200_sxm", backend="vllm", parallel=Parallel(tp=2),
                   decode=DecodePart(4, 1024 + 64)).total_ms
    assert two.steps["decode"]["batch"] == 4 and one.steps["decode"]["batch"] == 8
    assert two.steps["decode"]["ms"] == pytest.approx(td + 0.01, rel=1e-12)
    assert two.gpus == 2 * one.gpus


def test_disaggregated_without_worker_counts_answers_tpot_only(db: modperf.Database) -> None:
    """The decode pool's batch and tp fix its step, so TPOT is answered; without worker counts
    the prefill pool's load is unknown: TTFT (and the per-GPU rate) is null, with the reason."""
    row = {**QWEN, "mode": "disagg", "isl": 1024, "osl": 64, "prefill_tp_size": 2, "decode_tp_size": 2,
           "decode_batch_size": 8}
    out = predict(db, deployment_from_row(row), fitted=False)
    td = step_cost(db, model="Qwen/Qwen3-32B", system="h200_sxm", backend="vllm", parallel=Parallel(tp=2),
                   decode=DecodePart(8, 1024 + 32), graphed=True).total_ms
    assert out.tpot_ms == td and out.ttft_ms is None and out.tokens_per_s_per_gpu is None and out.gpus is None
    doc = out.to_dict()
    assert doc["ttft_ms"] is None and doc["ttft_reason"].startswith("TTFT needs the topology: without "
                                                                   "prefill_num_workers and decode_num_workers")
    assert "prefill_one" not in out.steps and out.steps["decode"]["graphed"] is True


def test_disaggregated_concurrency_without_workers_assumes_the_decode_batch(db: modperf.Database) -> None:
    """Neither decode_batch_size nor worker counts, only the concurrency (the file writes it in
    its provenance column): the decode batch per rank is ceil(concurrency / the decode worker's
    tp x attention-DP ranks) = ceil(21 / 2) = 11, an assumption the answer names; TPOT is that
    step, TTFT null."""
    row = {**QWEN, "mode": "disagg", "isl": 1024, "osl": 64, "prefill_tp_size": 2, "decode_tp_size": 2,
           "silicon_data_source": "source_file=2026-03-25.csv; model=Qwen3-32B; silicon_concurrency=21; wip=False"}
    dep = deployment_from_row(row)
    assert dep.decode.batch == 11 and dep.decode.workers is None and dep.concurrency == 21
    out = predict(db, dep, fitted=False)
    td = step_cost(db, model="Qwen/Qwen3-32B", system="h200_sxm", backend="vllm", parallel=Parallel(tp=2),
                   decode=DecodePart(11, 1024 + 32), graphed=True).total_ms
    assert out.tpot_ms == td and out.ttft_ms is None and out.serving["concurrency"] == 21
    assumption = ("assumed: decode batch per rank = ceil(concurrency 21 / 2 tp x attention-DP ranks of one decode "
                  "worker) = 11")
    assert out.provenance["assumptions"][0].startswith(assumption) and out.notes[0].startswith(assumption)
    # the field says the same as the provenance column, and wins over it
    same = deployment_from_row({**row, "concurrency": 21, "silicon_data_source": "silicon_concurrency=5"})
    assert same.decode.batch == 11
    # a deployment that fixes the pools must agree with its concurrency; a strict one assumes nothing
    fixed = {**QWEN, "mode": "disagg", "isl": 1024, "osl": 64, "prefill_tp_size": 2, "prefill_num_workers": 1,
             "decode_tp_size": 2, "decode_num_workers": 2, "decode_batch_size": 8}
    assert deployment_from_row({**fixed, "concurrency": 16}).assumptions == ()
    with pytest.raises(E.QueryFieldError, match="concurrency 12 contradicts the pools: decode_batch_size x "
                                                "decode_num_workers x decode_attention_dp_size = 16"):
        deployment_from_row({**fixed, "concurrency": 12})
    with pytest.raises(E.QueryFieldError, match=r"concurrency 9 contradicts the pools: batch_size x "
                                                r"attention_dp_size = 8"):
        deployment_from_row({**QWEN, "isl": 8, "osl": 8, "batch_size": 8, "tp_size": 1, "concurrency": 9})
    # an aggregated row's provenance column is not read (the file writes some batches per replica)
    agg = deployment_from_row({**QWEN, "isl": 8, "osl": 8, "batch_size": 8, "tp_size": 1,
                               "silicon_data_source": "silicon_concurrency=9"})
    assert agg.concurrency is None


def test_a_deployment_that_cannot_run_is_refused_with_the_figures(db: modperf.Database) -> None:
    """DeepSeek-V3's fp8 weights (~626 GiB) on one 80 GiB H100 of the prefill pool (the decode
    pool, over 16 GPUs, holds its 39 GiB share)."""
    row = {"model_path": "deepseek-ai/DeepSeek-V3", "system": "h100_sxm", "backend": "sglang", "mode": "disagg",
           "isl": 1024, "osl": 64, "prefill_tp_size": 1, "prefill_num_workers": 1, "decode_tp_size": 16,
           "decode_num_workers": 2, "decode_batch_size": 8}
    with pytest.raises(E.DeploymentFitError, match="deepseek-ai/DeepSeek-V3 does not fit the prefill pool on "
                                                   r"h100_sxm: its weights take 6\d\d\.\d GiB per GPU at tp 1") as exc:
        price(db, deployment_from_row(row))
    assert exc.value.values["gpu_gib"] == 80.0 and exc.value.values["weights_gib"] > 600
    assert exc.value.exit_code == 2 and exc.value.kind == "does_not_fit"
    # the decode pool is checked too: at tp 8 each GPU holds 78.3 GiB of weights beside the 3.5 GiB reserve
    with pytest.raises(E.DeploymentFitError, match=r"does not fit the decode pool on h100_sxm: its weights take "
                                                   r"78\.3 GiB per GPU at tp 8"):
        price(db, deployment_from_row({**row, "prefill_tp_size": 16, "decode_tp_size": 8}))
    # one request whose KV alone exceeds what the weights leave
    with pytest.raises(E.DeploymentFitError, match="one request of 1001000 tokens does not fit one GPU"):
        price(db, deployment_from_row({**QWEN, "system": "h100_sxm", "isl": 1_000_000, "osl": 1000,
                                       "batch_size": 1, "tp_size": 1}))


def test_a_backend_without_rules_is_refused_by_name(db: modperf.Database) -> None:
    from modperf.serving import backend_of

    with pytest.raises(E.OptionValueError, match="no serving rules for backend 'tensorrt'"):
        backend_of("tensorrt")
    with pytest.raises(E.OptionValueError, match="backends with serving rules: sglang, trtllm, vllm"):
        price(db, deployment_from_row({**QWEN, "backend": "tensorrt", "isl": 8, "osl": 8, "batch_size": 1,
                                       "tp_size": 1}))


def test_a_graphed_decode_gemm_drops_the_tables_per_call_floor(db: modperf.Database) -> None:
    """MiniMax-M2.5's block-scaled fp8 projections on b200 vLLM: the table's DeepGemm bucket
    floor (~0.17 ms at m 16, whatever the shape) is host-side work a CUDA graph replay does not
    pay; graphed, each projection costs its table answer less (bucket floor - GPU floor), at
    least the GPU floor plus its weight read at the system's bandwidth."""
    from modperf.model.step import GemmFloors, gemm_floors
    from modperf.specs.roofline import gpu_spec

    common = dict(model="MiniMaxAI/MiniMax-M2.5", system="b200_sxm", backend="vllm", parallel=Parallel(tp=4),
                  decode=DecodePart(16, 2048))
    eager = step_cost(db, **common)
    graphed = step_cost(db, **common, graphed=True)
    floors = gemm_floors(db, "b200_sxm", "vllm", "0.24.0")
    gpu = gpu_spec("b200_sxm")
    for before, after in zip(eager.ops, graphed.ops, strict=True):
        if before.table != "gemm" or before.fields.get("gemm_dtype") != "fp8_block":
            assert after.ms == before.ms and after.isolation_ms is None
            continue
        key = tuple(before.fields[k] for k in floors.key_names)
        floor, base = GemmFloors.at(floors.buckets[key], 16), GemmFloors.at(floors.gpu, 16)
        assert floor is not None and base is not None and floor > 0.1 and base < 0.003
        n, k = before.fields["n"], before.fields["k"]
        read = base + n * k / (gpu.mem_bw * gpu.mem_bw_scaling) * 1e3
        assert after.ms == pytest.approx(min(before.ms, max(before.ms - (floor - base), read)), rel=1e-12)
        assert after.isolation_ms == pytest.approx(before.ms - after.ms, rel=1e-12)
    assert graphed.total_ms is not None and eager.total_ms is not None
    assert graphed.total_ms < 0.5 * eager.total_ms
    # a bfloat16 model has no floor above the GPU's: graph replay changes nothing
    plain = dict(common, model="Qwen/Qwen3-32B")
    assert step_cost(db, **plain, graphed=True).total_ms == step_cost(db, **plain).total_ms


def test_allow_substitute_prices_an_unmeasured_native_and_says_so(db: modperf.Database) -> None:
    """Kimi-K2.5's 64 heads: vLLM's MLA module tables hold only DeepSeek's 128 (and vLLM has
    no MLA kernel tables to compose from). Refused strictly; with allow_substitute, the
    attention answers from the native-128 bucket at the rank's local heads, and says so."""
    row = {"model_path": "moonshotai/Kimi-K2.5", "system": "b200_sxm", "backend": "vllm", "mode": "agg",
           "isl": 1024, "osl": 128, "batch_size": 8, "tp_size": 8}
    with pytest.raises(E.NotCoveredError, match="has no native-64 bucket for this key; it holds native head "
                                                "counts 128"):
        price(db, deployment_from_row(row))
    out = predict(db, deployment_from_row(row), allow_substitute=True)
    subs = out.provenance["substitutions"]
    assert subs and all("answered from the nearest native bucket, 128 (allow_substitute)" in s for s in subs)
    assert any(s.startswith("L0-60 mla attention (decode)") for s in subs)
    assert any(n.startswith("substituted (allow_substitute): ") for n in out.notes)
    assert out.ttft_ms is not None and out.tpot_ms > 0
    # a strict answer lists none
    assert predict(db, deployment_from_row({**QWEN, "isl": 1024, "osl": 128, "batch_size": 8,
                                            "tp_size": 2})).provenance["substitutions"] == []


def test_backends_own_their_rules() -> None:
    """Each backend's defaults, from its documentation or source (docs/serving.md)."""
    from modperf.serving import BACKENDS

    vllm, sglang, trtllm = BACKENDS["vllm"], BACKENDS["sglang"], BACKENDS["trtllm"]
    h200, b200 = 151397597184, 193273528320
    assert [b.graph_max_batch(h200, 2) for b in (vllm, sglang, trtllm)] == [512, 256, 128]
    assert sglang.graph_max_batch(h200, 4) == 512 and sglang.graph_max_batch(b200, 1) == 512
    assert [b.scheduler for b in (vllm, sglang, trtllm)] == ["mixed", "prefill_first", "mixed"]
    assert trtllm.reserved_tokens(1000, 200) == 1200 and vllm.reserved_tokens(1000, 200) == 1100
    # TRT-LLM serves a quantised checkpoint with an fp8 KV cache; the others keep the model's bfloat16
    assert trtllm.kv_element_bytes("fp8_block") == 1.0 and trtllm.kv_element_bytes("nvfp4") == 1.0
    assert trtllm.kv_element_bytes("bfloat16") == 2.0
    assert {b.kv_element_bytes("fp8_block") for b in (vllm, sglang)} == {2.0}
    assert trtllm.kv_budget_bytes(mem_capacity=100.0, weights=20.0, other=10.0, chunk=8192, gpus=1) == 0.9 * 70.0
