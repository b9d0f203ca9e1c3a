"""GEMM tables: one rank's matrix multiply, keyed by dtype, kernel and the (m, n, k) shape.

A model-level estimate adds a model's projections from them (the QKV and output projections of
GQA models, whose attention rows exclude them; MoE routers; the logits GEMM). The shape is the
whole computation of one rank: ``m`` is the tokens the rank multiplies, ``n`` and ``k`` are its
shard of a tensor-parallel projection (column-parallel: n / tp, row-parallel: k / tp). No
column records tp; the ceiling guard catches a global n or k stored beside one rank's latency
(the implied flop rate would exceed the GPU's peak by the tp factor).
"""

from collections.abc import Mapping
from typing import Any

from ...specs.roofline import GpuSpec, Roof, bytes_of, per_value
from .base import PER_RANK, Ceiling, Family, NativeSource, Quantity, TableSpec, Tier, register

#: Achieved flop rate above the dtype's peak that a row may show before it is rejected. The
#: corpus peaks at 1.00x (b60 bfloat16); weight-only dtypes are held to the rate of their
#: weights' units, a generous bound (h100 sglang 0.5.6.post2 int8_wo reaches 1.19x the bf16
#: rate: a quality question, not a tp factor).
GEMM_CEILING = 1.25


def gemm_roof(table: str, cols: Mapping[str, Any], gpu: GpuSpec) -> Roof:
    """2mnk flops at the dtype's peak against reading A (m x k) and B (k x n) in the dtype and
    writing C (m x n) in 16 bits."""
    m, n, k = cols["m"], cols["n"], cols["k"]
    dtype = cols.get("gemm_dtype")
    flops = 2.0 * m * n * k
    moved = (1.0 * m * k + 1.0 * k * n) * per_value(bytes_of, dtype) + 2.0 * m * n
    return Roof(compute=flops / per_value(gpu.peak, dtype), memory=moved / gpu.mem_bw)


GEMM = register(
    Family(
        name="gemm",
        title="GEMM (projections)",
        tier=Tier.LOCAL,
        native_source=NativeSource.NONE,
        tables=(
            TableSpec(
                "gemm", "kernel", ("op_name", "kernel_source", "gemm_dtype"), (), ("m", "n", "k"), None,
                head_axis=False,
                quantities=(
                    Quantity("m", PER_RANK, "tokens this rank multiplies"),
                    Quantity("n", PER_RANK, "output features of this rank's shard",
                             beside="global n = n * tp for a column-parallel projection"),
                    Quantity("k", PER_RANK, "input features of this rank's shard",
                             beside="global k = k * tp for a row-parallel projection"),
                ),
                guards=(
                    Ceiling(GEMM_CEILING, "compute", "the dtype's tensor-core peak: 2mnk / latency",
                            "m, n, k must be the shape one rank multiplied: store n (or k) divided by the "
                            "tensor-parallel size for a sharded projection, or re-measure these rows"),
                ),
            ),
        ),
        rationale="a GEMM's shape and dtype are its whole key; the shape is one rank's",
        model_head_axis=False,
        roof=gemm_roof,
    )
)
