"""Kimi Delta Attention kernels (Kimi-K3's linear layers): the gdn layout, with a ``verify``
phase for speculative decoding (``seq_len`` = draft tokens). Heads are rank-local; Kimi-K3's
config gives ``linear_attn_config.num_heads`` for key and value heads alike (96: rows at
96, 48, 24, 12). Evidence: docs/families.md."""

from .base import Family, NativeSource, Tier, register
from .linear_attention import linear_roof, local_heads_spec

KDA = register(
    Family(
        name="kda",
        title="Kimi Delta Attention",
        tier=Tier.LOCAL,
        native_source=NativeSource.NONE,
        tables=(local_heads_spec("kda", (("num_k_heads", "linear_attn_config.num_heads"),
                                         ("num_v_heads", "linear_attn_config.num_heads"))),),
        rationale="the kernels read heads, head dims and the convolution width: the local key completes them",
        model_head_axis=False,
        roof=linear_roof,
    )
)
