"""DeepSeek-V4 manifold-constrained hyper-connections (``mhc_module``): the pre / post mixing of
the ``hc_mult`` residual streams around each layer, with Sinkhorn normalisation.

``num_tokens`` is the tokens on the rank; ``hidden_size`` is the model's full residual width
(the hyper-connection streams are replicated, not tensor-parallel). The row names its
``architecture``; its hidden size, hc_mult and Sinkhorn iterations must be those of a model
config of that architecture (DeepSeek-V4-Flash 4096, Pro 7168). Evidence: docs/families.md.
"""

from collections.abc import Mapping
from typing import Any

from ...specs.roofline import GpuSpec, Roof
from .base import (
    NATIVE_VALUE,
    PER_RANK,
    ArchitectureFields,
    DuplicateSpread,
    Family,
    NativeSource,
    Quantity,
    TableSpec,
    Tier,
    register,
)


def mhc_roof(table: str, cols: Mapping[str, Any], gpu: GpuSpec) -> Roof:
    """Read and write hc_mult streams of hidden bf16 values per token; mix them (hc x hc plus
    the projections to the mixing weights) and normalise hc x hc matrices per Sinkhorn step."""
    tokens, hidden, hc = 1.0 * cols["num_tokens"], 1.0 * cols["hidden_size"], 1.0 * cols["hc_mult"]
    flops = 2.0 * tokens * hc * hidden * (hc + 2.0) + cols["sinkhorn_iters"] * hc * hc * tokens
    return Roof(compute=flops / gpu.bf16_flops, memory=2.0 * tokens * hc * hidden * 2.0 / gpu.mem_bw)


MHC = register(
    Family(
        name="mhc",
        title="hyper-connections (DeepSeek-V4)",
        tier=Tier.LOCAL,
        native_source=NativeSource.NONE,
        tables=(
            TableSpec("mhc_module", "kernel", ("op_name", "kernel_source"),
                      ("hidden_size", "hc_mult", "num_sites", "sinkhorn_iters"), ("num_tokens",), None,
                      head_axis=False,
                      quantities=(Quantity("num_tokens", PER_RANK, "tokens on the rank"),
                                  Quantity("hidden_size", NATIVE_VALUE, "the model's residual width (replicated on "
                                           "every rank)")),
                      guards=(ArchitectureFields("architecture", (("hidden_size", "hidden_size"),
                                                                  ("hc_mult", "hc_mult"),
                                                                  ("sinkhorn_iters", "hc_sinkhorn_iters")),
                                                 "store the model's full hidden_size, hc_mult and hc_sinkhorn_iters "
                                                 "(the residual streams are not sharded)"),
                              DuplicateSpread("rows at one key must measure one kernel configuration"))),
        ),
        rationale="the streams' width, count and Sinkhorn steps are the whole key",
        model_head_axis=False,
        roof=mhc_roof,
    )
)
