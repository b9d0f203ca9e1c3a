"""MLA attention module (DeepSeek-V3/R1, Kimi): [native][local].

The module includes the q/kv down- and up-projections and the output projection, whose shapes
depend on hidden_size and the lora ranks: model variables outside the local key. Two natives
sharding to the same local count (DeepSeek-V3 128 @ tp2 and Kimi-K2 64 @ tp1) are different
modules, so the head axis keys [native][local].
"""

from collections.abc import Mapping
from typing import Any

from ...specs.models import ConfigField
from ...specs.roofline import GpuSpec, WorkModel, bytes_of, common_terms, geo
from .base import Family, NativeSource, Tier, module_spec, register

#: What an MLA module computes with. ``head_dim`` is deliberately absent: in MLA-style configs
#: the q/k widths are qk_nope_head_dim + qk_rope_head_dim and the v width is v_head_dim;
#: ``head_dim`` is a label the module never reads (GLM-5 says 64, GLM-5.2 says 192, same dims).
MLA_GEOMETRY = (
    ConfigField("hidden_size"),
    ConfigField("q_lora_rank"),
    ConfigField("kv_lora_rank"),
    ConfigField("qk_nope_head_dim"),
    ConfigField("qk_rope_head_dim"),
    ConfigField("v_head_dim"),
    # Kimi-K3 gates the attention output with an extra projection; absent means no gate.
    ConfigField("mla_use_output_gate", False),
)



def mla_module_work(table: str, phase: str, key: Mapping[str, Any], geometry: Mapping[str, Any],
                    gpu: GpuSpec, *, indexer: bool = False) -> WorkModel:
    """The module's projections (q/kv down and up, output, Kimi-K3's gate) per token, the
    attention core (non-absorbed in context, absorbed over the latent cache in decode) and,
    for DSA (``indexer``), the indexer's scoring per (query, key) pair and the top-k cap."""
    hidden = geo(geometry, "hidden_size", 7168)
    q_lora, kv_lora = geo(geometry, "q_lora_rank", 1536), geo(geometry, "kv_lora_rank", 512)
    nope, rope, v = geo(geometry, "qk_nope_head_dim", 128), geo(geometry, "qk_rope_head_dim", 64), \
        geo(geometry, "v_head_dim", 128)
    kv_b = bytes_of(key.get("kv_cache_dtype"))
    gate = hidden * v if geo(geometry, "mla_use_output_gate", 0) else 0.0
    proj_shared = hidden * q_lora + hidden * (kv_lora + rope)
    proj_per_head = q_lora * (nope + rope) + kv_lora * (nope + v) + v * hidden + gate
    if phase == "context":
        pair, kv_tok, kv_head = 2.0 * (nope + rope + v), rope * kv_b, (nope + v) * kv_b
    else:
        pair, kv_tok, kv_head = 2.0 * (2 * kv_lora + rope), (kv_lora + rope) * kv_b, 0.0
    shared_pair, cap = 0.0, 0.0
    if indexer:
        if not str(key.get("op_name", "")).endswith("_skip_indexer"):
            shared_pair = 2.0 * geo(geometry, "index_n_heads", 64) * geo(geometry, "index_head_dim", 128)
        cap = geo(geometry, "index_topk", 2048)
    return WorkModel(proj_shared=proj_shared, proj_per_head=proj_per_head, pair_flops_per_head=pair,
                     pair_flops_shared=shared_pair, kv_bytes_per_token=kv_tok, kv_bytes_per_token_per_head=kv_head,
                     act_bytes_per_token_per_head=(nope + rope + v) * 2.0, cap=cap, **common_terms(phase, key, gpu))


MLA_MODULE = register(
    Family(
        name="mla_module",
        title="MLA attention module",
        tier=Tier.NATIVE_LOCAL,
        native_source=NativeSource.MODEL_CONFIG,
        tables=(
            module_spec("mla_context_module", "context"),
            module_spec("mla_generation_module", "generation"),
        ),
        geometry=MLA_GEOMETRY,
        requires_model=True,
        requires_tp=True,
        rationale=(
            "projections depend on hidden_size and the q/kv lora ranks, outside the local key; "
            "one local count under two natives is two modules"
        ),
        work=mla_module_work,
    )
)
