"""GEMM tables: not head-bearing. A model-level estimate adds the QKV and output projections
of GQA models from them, so that GQA layers compare like for like with module families (whose
rows include their projections). Keyed by dtype, kernel and the (m, n, k) shape."""

from .base import Family, NativeSource, TableSpec, Tier, register

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
    )
)
