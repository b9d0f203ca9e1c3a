"""Vision-encoder attention (``encoder_attention``): the ViT tower's full (non-causal) attention,
keyed like GQA attention by the local heads and their dims.

``num_heads`` is what one rank runs (the ViT builder passes the vision heads / tp); the table
records no tp and no model, so it is local-only and its heads are the *vision tower's*, not the
language model's attention heads: the model head-axis tools (coverage, migrate) do not apply.
Guards on the data: latency linear in heads (a table keyed by anything but the heads that ran
would not be) and agreeing duplicates. Evidence: docs/families.md.
"""

from collections.abc import Mapping
from typing import Any

from ...specs.roofline import GpuSpec, WorkModel, common_terms
from .base import (
    PER_RANK,
    DuplicateSpread,
    Family,
    NativeSource,
    Quantity,
    Scaling,
    TableSpec,
    Tier,
    register,
)


def encoder_work(table: str, phase: str, key: Mapping[str, Any], geometry: Mapping[str, Any],
                 gpu: GpuSpec) -> WorkModel:
    """Every token attends to every token of its image: q.k and p.v over head_dim per pair;
    q, k, v and the output read or written once per token and head."""
    d = float(key.get("head_dim") or 64)
    return WorkModel(causal=False, pair_flops_per_head=4.0 * d, act_bytes_per_token_per_head=4.0 * d * 2.0,
                     **common_terms("context", key, gpu))


ENCODER_ATTENTION = register(
    Family(
        name="encoder_attention",
        title="vision-encoder attention",
        tier=Tier.LOCAL,
        native_source=NativeSource.NONE,
        tables=(
            TableSpec("encoder_attention", "context", ("op_name", "kernel_source", "attn_dtype"), ("head_dim",),
                      ("batch_size", "isl"), "isl",
                      quantities=(Quantity("num_heads", PER_RANK, "vision heads one rank runs",
                                           beside="the tower's: num_heads * tp"),
                                  Quantity("isl", PER_RANK, "patches (tokens) per image")),
                      guards=(
                          Scaling("num_heads counts the heads that ran", {"num_heads": 2},
                                  expect="latency about doubling with the heads at long sequences (corpus medians "
                                         "1.95-2.03)",
                                  other="heads that did not all run on this rank would not scale the work",
                                  fix="store the heads one rank ran (the tower's heads divided by tp)",
                                  low=1.5, high=2.3, at_least={"isl": 4096}),
                          DuplicateSpread("rows at one key must measure one workload: store the heads one rank ran"),
                      )),
        ),
        rationale="like GQA attention: local heads, head_dim and the dtype complete the kernel's key",
        model_head_axis=False,
        work=encoder_work,
    )
)
