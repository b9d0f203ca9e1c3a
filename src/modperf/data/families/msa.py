"""MiniMax sparse attention module (MiniMax-M3): [native][local].

A GQA-shaped attention with a block-sparse selector: its cost depends on the projections
(hidden_size), kv heads, head_dim and the selector's configuration, model variables outside
the local key.
"""

from collections.abc import Mapping
from typing import Any

from ...specs.models import ConfigField
from ...specs.roofline import GpuSpec, WorkModel, bytes_of, common_terms, geo
from .base import Family, NativeSource, Tier, module_spec, register

_SPARSE = "sparse_attention_config."



def msa_work(table: str, phase: str, key: Mapping[str, Any], geometry: Mapping[str, Any],
             gpu: GpuSpec) -> WorkModel:
    """GQA-shaped: q/o projections per head, k/v projections shared, attention capped by the
    selector's top-k blocks."""
    hidden = geo(geometry, "hidden_size", 7168)
    d, kvh = geo(geometry, "head_dim", 128), geo(geometry, "num_key_value_heads", 8)
    kv_b = bytes_of(key.get("kv_cache_dtype"))
    cap = geo(geometry, _SPARSE + "sparse_topk_blocks", 0) * geo(geometry, _SPARSE + "sparse_block_size", 0)
    return WorkModel(proj_shared=hidden * 2 * kvh * d, proj_per_head=2.0 * hidden * d, pair_flops_per_head=4.0 * d,
                     kv_bytes_per_token=2.0 * kvh * d * kv_b, act_bytes_per_token_per_head=2.0 * d * 2.0, cap=cap,
                     **common_terms(phase, key, gpu))


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
        work=msa_work,
    )
)
