"""GQA attention kernels (Llama, Qwen, Mixtral, gpt-oss, ...): local-only.

Local q heads, kv heads, head_dim and the sliding window are all key columns, so one local key
is one physical computation whatever model it came from; a native count adds nothing and the
tables record none (no model, no tp_size column). No collision can exist.
"""

from ..models import ConfigField
from .base import Family, NativeSource, TableSpec, Tier, register

_CATEGORICAL = ("op_name", "kernel_source", "attn_dtype", "kv_cache_dtype")
# window_size is absent from older files (those measured full attention only).
_DISCRETE = ("num_key_value_heads", "head_dim", "window_size", "beam_width")

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
    )
)
