"""The roofline yardstick: GPU specs read from the corpus's system files, and the work models
families declare (extrapolation scales by their ratio, so the shape along each axis matters)."""

from __future__ import annotations

import pytest

from modperf.families import registry
from modperf.roofline import DEFAULT_GPU, AxisWork, WorkModel, bytes_of, gpu_spec

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
