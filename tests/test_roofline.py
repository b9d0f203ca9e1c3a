"""The roofline yardstick: GPU specs read from the corpus's system files, and the work models
families declare (extrapolation scales by their ratio, so the shape along each axis matters)."""

from __future__ import annotations

import pytest

from modperf.data.families import registry
from modperf.specs.roofline import DEFAULT_GPU, AxisWork, WorkModel, bytes_of, gpu_spec

H200 = gpu_spec("h200_sxm")


def test_gpu_specs_come_from_the_system_yaml() -> None:
    # systems/h200_sxm.yaml: mem_bw 4800 GB/s, bf16 989 TFLOPS, fp8 1978 TFLOPS, no fp4 units
    assert (H200.mem_bw, H200.bf16_flops, H200.fp8_flops, H200.fp4_flops) == (4.8e12, 989e12, 1978e12, 1978e12)
    assert H200.from_file
    a100 = gpu_spec("a100_sxm")  # no fp8 units: fp8 runs at the bf16 rate
    assert a100.fp8_flops == a100.bf16_flops == 312e12
    gb300 = gpu_spec("gb300")
    assert (gb300.fp4_flops, gb300.peak("nvfp4"), gb300.peak("fp8_block"), gb300.peak("bfloat16")) == (
        1.5e16, 1.5e16, 5e15, 2.5e15)


def test_unknown_system_uses_the_default_gpu_and_says_so() -> None:
    spec = gpu_spec("no_such_system")
    assert not spec.from_file
    assert (spec.bf16_flops, spec.mem_bw) == (DEFAULT_GPU["bfloat16_tc_flops"], DEFAULT_GPU["mem_bw"])


@pytest.mark.parametrize(("dtype", "size"), [("bfloat16", 2.0), ("fp8", 1.0), ("fp8_block", 1.0), ("int8", 1.0),
                                             ("nvfp4", 0.5), ("int4_wo", 0.5), (None, 2.0)])
def test_bytes_per_element(dtype: str | None, size: float) -> None:
    assert bytes_of(dtype) == size


def test_every_declared_family_has_a_work_model() -> None:
    """Head-axis tables get an attention-shaped WorkModel, the others their family's row roofline
    over their own axes."""
    key = {"kv_cache_dtype": "bfloat16", "attn_dtype": "bfloat16", "gemm_type": "bfloat16", "head_dim": 128,
           "num_key_value_heads": 8, "gemm_dtype": "bfloat16", "compress_ratio": 4}
    for fam in registry().values():
        assert fam.work is not None or fam.roof is not None, fam.name
        for spec in fam.tables:
            work = fam.work_model(spec.name, spec.phase, key, {}, H200)
            if spec.head_axis:
                assert isinstance(work, WorkModel), spec.name
            else:
                assert isinstance(work, AxisWork) and work.axes == spec.axes, spec.name


def test_gemm_roofline_is_2mnk_against_the_peak() -> None:
    work = registry()["gemm"].work_model("gemm", "kernel", {"gemm_dtype": "bfloat16"}, {}, H200)
    # 4096^3 is compute-bound on an H200: 2mnk / 989 TFLOPS exactly
    assert work.shape_seconds((4096.0, 4096.0, 4096.0)) == 2 * 4096**3 / 989e12
    # one token is memory-bound: the 4096 x 4096 bf16 weight read dominates
    m1 = work.shape_seconds((1.0, 4096.0, 4096.0))
    assert m1 == pytest.approx(((4096 + 4096 * 4096) * 2.0 + 4096 * 2.0) / 4.8e12)


def test_gqa_decode_is_kv_bound_and_linear_in_batch() -> None:
    key = {"head_dim": 128, "num_key_value_heads": 8, "kv_cache_dtype": "bfloat16", "attn_dtype": "bfloat16"}
    work = registry()["gqa"].work_model("generation_attention", "generation", key, {}, H200)
    t8, t16 = work.seconds(8, 1, 4096, 32), work.seconds(16, 1, 4096, 32)
    assert t16 == pytest.approx(2 * t8)
    # bytes: batch x kv length x (k and v: 2 x kv heads x head_dim x 2 bytes) + activations
    kv = 8 * 4097 * 2 * 8 * 128 * 2.0
    act = 8 * 32 * 2 * 128 * 2.0
    assert t8 == pytest.approx((kv + act) / 4.8e12)
    # a sliding window caps the keys read
    capped = registry()["gqa"].work_model("generation_attention", "generation", {**key, "window_size": 1024}, {}, H200)
    assert capped.seconds(8, 1, 4096, 32) < t8 / 3


def test_context_attention_grows_faster_than_linear_in_isl() -> None:
    key = {"head_dim": 128, "num_key_value_heads": 8, "kv_cache_dtype": "bfloat16", "attn_dtype": "bfloat16"}
    work = registry()["gqa"].work_model("context_attention", "context", key, {}, H200)
    assert work.seconds(1, 16384, 0, 32) / work.seconds(1, 8192, 0, 32) == pytest.approx(4.0, rel=1e-3)


def test_node_specs_come_from_the_system_yaml() -> None:
    # systems/h200_sxm.yaml node: 8 GPUs, NVLink 450 GB/s and 50 GB/s to other nodes, 10 us hops
    assert (H200.gpus_per_node, H200.intra_node_bw, H200.inter_node_bw, H200.p2p_latency) == (8, 450e9, 50e9, 1e-5)
    assert gpu_spec("gb200").gpus_per_node == 4  # two Grace CPUs with two GPUs each
    assert H200.link_bw(8) == 450e9 and H200.link_bw(16) == 50e9
    assert gpu_spec("a100_sxm").peak("int8_wo") == 624e12  # int8 units: twice the bf16 rate on A100


def axis_seconds(family: str, table: str, key: dict, values: tuple) -> float:
    work = registry()[family].work_model(table, "kernel", key, {}, H200)
    assert isinstance(work, AxisWork)
    return float(work.shape_seconds(values))


def test_allreduce_roofline_is_ring_bytes_over_the_link_plus_a_hop() -> None:
    key = {"op_name": "all_reduce", "allreduce_dtype": "bfloat16", "num_gpus": 8}
    m = float(1 << 28)
    expected = 2 * 7 / 8 * m * 2.0 / 450e9 + 1e-5
    assert axis_seconds("custom_allreduce", "custom_allreduce", key, (m,)) == pytest.approx(expected, rel=1e-12)
    gather = {"op_name": "all_gather", "nccl_dtype": "int8", "num_gpus": 4}
    assert axis_seconds("collective", "nccl", gather, (m,)) == pytest.approx(3 / 4 * m / 450e9 + 1e-5, rel=1e-12)


def test_moe_roofline_is_the_rank_s_share_of_the_routed_pairs() -> None:
    key = {"kernel_source": "moe_torch_flow", "moe_dtype": "bfloat16", "hidden_size": 7168, "inter_size": 2048,
           "topk": 8, "num_experts": 256, "moe_tp_size": 8, "moe_ep_size": 2}
    tokens = 65536.0
    pairs = tokens * 8 / 2
    flops = 2 * 3 * pairs * 7168 * (2048 / 8)
    assert axis_seconds("moe", "moe", key, (tokens,)) == pytest.approx(flops / 989e12, rel=1e-12)  # compute-bound
    # one token: bound by reading the 8 experts it touches (bf16 weights of gate, up and down)
    one = axis_seconds("moe", "moe", key, (1.0,))
    weights = 4 * 3 * 7168 * (2048 / 8) * 2.0
    assert one == pytest.approx((weights + 4 * (2 * 7168 + 3 * 256) * 2.0) / 4.8e12, rel=1e-12)
    # dsv4_megamoe_module counts per-rank tokens: the group's are ep times more
    mega = axis_seconds("moe", "dsv4_megamoe_module", {**key, "moe_ep_size": 8}, (tokens / 8,))
    assert mega == pytest.approx(axis_seconds("moe", "moe", {**key, "moe_ep_size": 8}, (tokens,)), rel=1e-12)


def test_alltoall_roofline_sends_each_token_to_its_distinct_ranks() -> None:
    key = {"phase": "combine", "comm_dtype": "fp8", "ep_size": 8, "topk": 8, "hidden_size": 7168}
    tokens = 4096.0
    ranks = 8 * (1 - (7 / 8) ** 8)
    expected = tokens * ranks * 7 / 8 * 7168 * 2.0 / 450e9 + 1e-5  # the combine returns bf16
    assert axis_seconds("alltoall", "moe_a2a", key, (tokens, 20.0)) == pytest.approx(expected, rel=1e-12)
