"""GEMM tables: not head-bearing. A model-level estimate adds the QKV and output projections
of GQA models from them, so that GQA layers compare like for like with module families (whose
rows include their projections). Keyed by dtype, kernel and the (m, n, k) shape."""

from collections.abc import Mapping
from typing import Any

from ..roofline import GpuSpec, WorkModel, bytes_of, common_terms
from .base import Family, NativeSource, TableSpec, Tier, register


def gemm_work(table: str, phase: str, key: Mapping[str, Any], geometry: Mapping[str, Any],
              gpu: GpuSpec) -> WorkModel:
    """2mnk flops against reading A, B and writing C (WorkModel.shape_seconds)."""
    dtype = key.get("gemm_dtype")
    return WorkModel(operand_bytes=bytes_of(dtype), **{**common_terms(phase, key, gpu), "proj_peak": gpu.peak(dtype)})


GEMM = register(
    Family(
        name="gemm",
        title="GEMM (projections)",
        tier=Tier.LOCAL,
        native_source=NativeSource.NONE,
        tables=(
            TableSpec("gemm", "kernel", ("op_name", "kernel_source", "gemm_dtype"), (), ("m", "n", "k"), None,
                      head_axis=False),
        ),
        rationale="a GEMM's shape and dtype are its whole key",
        head_bearing=False,
        work=gemm_work,
    )
)
