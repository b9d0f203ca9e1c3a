"""Wide-EP shared-expert MLP (``wideep_context_mlp`` / ``wideep_generation_mlp``): DeepSeek-V3's
shared expert as one rank runs it under attention data parallelism.

The tables call the latency ``avg_ms`` (milliseconds) and the tokens ``num_token``; the loader
keys ``latency`` and ``num_tokens``. ``num_tokens`` is the rank's tokens; ``intermediate_size``
is the expert's full width (wide-EP replicates shared experts on every rank: no tp split). The
compute ceiling catches an intermediate size larger than what the rank multiplied.
Evidence: docs/families.md.
"""

from collections.abc import Mapping
from typing import Any

from ...specs.roofline import GpuSpec, Roof, bytes_of, per_value
from .base import (
    NATIVE_VALUE,
    PER_RANK,
    Ceiling,
    DuplicateSpread,
    Family,
    Measure,
    NativeSource,
    Quantity,
    TableSpec,
    Tier,
    register,
)
from .gemm import GEMM_CEILING


def mlp_roof(table: str, cols: Mapping[str, Any], gpu: GpuSpec) -> Roof:
    """Three GEMMs (gate, up, down) of tokens x hidden x intermediate; the weights read once."""
    tokens, hidden, inter = 1.0 * cols["num_tokens"], 1.0 * cols["hidden_size"], 1.0 * cols["intermediate_size"]
    dtype = cols.get("quant_type")
    moved = 3.0 * hidden * inter * per_value(bytes_of, dtype) + tokens * (2.0 * hidden + 3.0 * inter) * 2.0
    return Roof(compute=6.0 * tokens * hidden * inter / per_value(gpu.peak, dtype), memory=moved / gpu.mem_bw)


def _spec(name: str, phase: str) -> TableSpec:
    return TableSpec(
        name, phase, ("op_name", "kernel_source", "quant_type"), ("hidden_size", "intermediate_size"),
        ("num_tokens",), None, head_axis=False, latency=Measure("avg_ms", "ms"), renames={"num_token": "num_tokens"},
        quantities=(Quantity("num_tokens", PER_RANK, "tokens on the rank (its attention-DP share)"),
                    Quantity("intermediate_size", NATIVE_VALUE, "the shared expert's full width (replicated, no tp "
                             "split)")),
        guards=(Ceiling(GEMM_CEILING, "compute", "the dtype's tensor-core peak: 6 t h I / latency",
                        "store the intermediate size one rank multiplied"),
                DuplicateSpread("rows at one key must measure one configuration")))


MLP = register(
    Family(
        name="mlp",
        title="wide-EP shared-expert MLP",
        tier=Tier.LOCAL,
        native_source=NativeSource.NONE,
        tables=(_spec("wideep_context_mlp", "context"), _spec("wideep_generation_mlp", "generation")),
        rationale="three GEMMs whose shape is the key",
        model_head_axis=False,
        roof=mlp_roof,
    )
)
