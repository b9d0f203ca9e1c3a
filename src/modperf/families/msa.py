"""MiniMax sparse attention module (MiniMax-M3): [native][local].

A GQA-shaped attention with a block-sparse selector: its cost depends on the projections
(hidden_size), kv heads, head_dim and the selector's configuration, model variables outside
the local key.
"""

from ..models import ConfigField
from .base import Family, NativeSource, Tier, module_spec, register

_SPARSE = "sparse_attention_config."

MSA = register(
    Family(
        name="msa",
        title="MiniMax MSA attention module",
        tier=Tier.NATIVE_LOCAL,
        native_source=NativeSource.MODEL_CONFIG,
        tables=(
            module_spec("msa_context_module", "context"),
            module_spec("msa_generation_module", "generation"),
        ),
        geometry=(
            ConfigField("hidden_size"),
            ConfigField("num_key_value_heads"),
            ConfigField("head_dim"),
            ConfigField("rotary_dim", None),
            ConfigField("use_qk_norm", False),
            ConfigField(_SPARSE + "use_sparse_attention", False),
            ConfigField(_SPARSE + "sparse_index_dim", None),
            ConfigField(_SPARSE + "sparse_num_index_heads", None),
            ConfigField(_SPARSE + "sparse_topk_blocks", None),
            ConfigField(_SPARSE + "sparse_block_size", None),
            ConfigField(_SPARSE + "sparse_init_block", None),
            ConfigField(_SPARSE + "sparse_local_block", None),
            ConfigField(_SPARSE + "sparse_score_type", None),
        ),
        requires_model=True,
        requires_tp=True,
        rationale="projections, kv heads and the block-sparse selector are model variables outside the local key",
    )
)
