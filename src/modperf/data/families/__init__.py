"""Family declarations. Importing this package registers every family."""

from . import (  # noqa: F401  (registration)
    alltoall,
    collective,
    custom_allreduce,
    dsa,
    dsv4,
    encoder_attention,
    gemm,
    gqa,
    kda,
    linear_attention,
    mhc,
    mla_kernel,
    mla_module,
    mlp,
    moe,
    msa,
    quantize,
    sparse,
)
from .base import (
    Family,
    NativeSource,
    TableSpec,
    Tier,
    declared_tables,
    family_of,
    model_head_axis_tables,
    registry,
)

__all__ = [
    "Family",
    "NativeSource",
    "TableSpec",
    "Tier",
    "declared_tables",
    "family_of",
    "model_head_axis_tables",
    "registry",
]
