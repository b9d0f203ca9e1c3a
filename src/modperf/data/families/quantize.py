"""Activation quantization kernels: ``scale_matrix`` (static per-tensor fp8 quantization of an
[m, k] activation) and ``computescale`` (the extra cost of computing the scale dynamically).

``m`` is the tokens on the rank and ``k`` the width of the activation that rank quantizes (its
shard where the consumer is row-parallel). ``computescale`` stores a clamped difference,
``max(0, dynamic - static)``, so zero is a real value on any of its rows. The memory ceiling,
beyond the L2 cache, catches a ``k`` (or ``m``) larger than what the rank quantized.
Evidence: docs/families.md.
"""

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...specs.roofline import GpuSpec, Roof, bytes_of, per_value
from .base import PER_RANK, Ceiling, DuplicateSpread, Family, NativeSource, Quantity, TableSpec, Tier, register

#: Rows moving at least this many bytes are beyond every corpus GPU's L2 cache: there HBM
#: bandwidth bounds them (smaller shapes reach several times it from the cache).
BEYOND_L2_BYTES = 512 * 2**20
MEMORY_CEILING = 1.25


def quantize_roof(table: str, cols: Mapping[str, Any], gpu: GpuSpec) -> Roof:
    """Read the bf16 activation, write it quantized; the dynamic scale reads it once more."""
    elements = 1.0 * cols["m"] * cols["k"]
    out = per_value(bytes_of, cols.get("quant_dtype"))
    passes = 2.0 if table == "computescale" else 2.0 + out
    return Roof(memory=elements * passes / gpu.mem_bw)


def _beyond_l2(cols: Mapping[str, Any]) -> np.ndarray:
    return 3.0 * cols["m"] * cols["k"] >= BEYOND_L2_BYTES


QUANTITIES = (Quantity("m", PER_RANK, "tokens on the rank"),
              Quantity("k", PER_RANK, "width of the activation the rank quantizes",
                       beside="global width = k * tp where the consumer is row-parallel"))
SPREAD = DuplicateSpread("rows at one key must measure one kernel: store what the collector varied as a key")


def _always(columns: Mapping[str, np.ndarray], per_row: Any) -> np.ndarray:
    return np.ones(len(columns["m"]), dtype=bool)


QUANTIZE = register(
    Family(
        name="quantize",
        title="activation quantization",
        tier=Tier.LOCAL,
        native_source=NativeSource.NONE,
        tables=(
            TableSpec("scale_matrix", "kernel", ("op_name", "kernel_source", "quant_dtype"), (), ("m", "k"), None,
                      head_axis=False, quantities=QUANTITIES,
                      guards=(Ceiling(MEMORY_CEILING, "memory", "HBM bandwidth: 3mk bytes / latency",
                                      "m and k must be the activation one rank quantized: store its shard's width",
                                      where=_beyond_l2, where_text="rows moving >= 512 MiB, beyond the L2 cache"),
                              SPREAD)),
            TableSpec("computescale", "kernel", ("op_name", "kernel_source", "quant_dtype"), (), ("m", "k"), None,
                      head_axis=False, quantities=QUANTITIES, guards=(SPREAD,),
                      zero_latency_rule=_always,
                      zero_latency_note="every row: the latency is max(0, dynamic - static), a clamped difference"),
        ),
        rationale="a quantization kernel's work is its [m, k] activation and dtypes",
        model_head_axis=False,
        roof=quantize_roof,
    )
)
