"""GQA attention kernels (Llama, Qwen, Mixtral, gpt-oss, ...): local-only.

Local q heads, kv heads, head_dim and the sliding window are all key columns, so one local key
is one physical computation whatever model it came from; a native count adds nothing and the
tables record none (no model, no tp_size column). No collision can exist.
"""

from collections.abc import Mapping
from typing import Any

from ...specs.models import ConfigField
from ...specs.roofline import GpuSpec, WorkModel, bytes_of, common_terms
from .base import Family, NativeSource, TableSpec, Tier, register

_CATEGORICAL = ("op_name", "kernel_source", "attn_dtype", "kv_cache_dtype")
# window_size is absent from older files (those measured full attention only).
_DISCRETE = ("num_key_value_heads", "head_dim", "window_size", "beam_width")



def gqa_work(table: str, phase: str, key: Mapping[str, Any], geometry: Mapping[str, Any],
             gpu: GpuSpec) -> WorkModel:
    """q.k and p.v per head over the attended keys (capped by the window); the kv cache read
    (kv heads x head_dim, shared by a beam)."""
    d, kvh = float(key.get("head_dim") or 128), float(key.get("num_key_value_heads") or 8)
    beam = float(key.get("beam_width") or 1)
    kv_b = bytes_of(key.get("kv_cache_dtype"))
    window = float(key.get("window_size") or 0)
    return WorkModel(pair_flops_per_head=4.0 * d, kv_bytes_per_token=2.0 * kvh * d * kv_b / beam,
                     act_bytes_per_token_per_head=2.0 * d * 2.0, cap=window, **common_terms(phase, key, gpu))


GQA = register(
    Family(
        name="gqa",
        title="GQA attention kernel",
        tier=Tier.LOCAL,
        native_source=NativeSource.NONE,
        tables=(
            TableSpec(
                "context_attention", "context", _CATEGORICAL, _DISCRETE,
                ("batch_size", "isl", "step"), "isl", frozenset({"window_size"}),
            ),
            TableSpec(
                "generation_attention", "generation", _CATEGORICAL, _DISCRETE,
                ("batch_size", "isl", "step"), "step", frozenset({"window_size"}),
            ),
        ),
        # What the kernel reads, all of it already in the key (for estimate and docs).
        geometry=(ConfigField("num_key_value_heads"), ConfigField("head_dim", None)),
        rationale=(
            "local q heads, kv heads, head_dim and window are all in the key: the same local key "
            "is the same kernel launch for any model, so native adds no information"
        ),
        work=gqa_work,
        kv_heads_key="num_key_value_heads",
        projections_in_rows=False,
    )
)
