"""Family declarations. Importing this package registers every family."""

from . import dsa, dsv4, gemm, gqa, mla_kernel, mla_module, msa, sparse  # noqa: F401  (registration)
from .base import (
    Family,
    NativeSource,
    TableSpec,
    Tier,
    family_of,
    head_bearing_tables,
    registry,
)

__all__ = [
    "Family",
    "NativeSource",
    "TableSpec",
    "Tier",
    "family_of",
    "head_bearing_tables",
    "registry",
]
