"""DeepSeek-V4 compressed sparse (CSA) and heavily compressed (HCA) attention modules:
[native][local].

Flash (64 native) and Pro (128 native) coexist in one file and their tp chains share local
counts 16/32/64; the module bundles q/o low-rank projections, grouped output, the indexer and
the sliding window, all model variables. The per-layer compress ratio is a key column; which
layer uses which ratio is the model's layer schedule (``compress_ratios``).
"""

from collections.abc import Mapping
from typing import Any

from ...specs.models import ConfigField
from ...specs.roofline import GpuSpec, WorkModel, bytes_of, common_terms, geo
from .base import Family, NativeSource, Tier, module_spec, register

DSV4_GEOMETRY = (
    ConfigField("hidden_size"),
    ConfigField("num_key_value_heads"),
    ConfigField("q_lora_rank"),
    ConfigField("o_lora_rank"),
    ConfigField("o_groups"),
    # In DeepSeek-V4 head_dim is the real attention width (512), read by the module.
    ConfigField("head_dim"),
    ConfigField("qk_rope_head_dim"),
    ConfigField("index_n_heads"),
    ConfigField("index_head_dim"),
    ConfigField("index_topk"),
    ConfigField("sliding_window"),
)

_DISCRETE = ("compress_ratio",)


def dsv4_work(table: str, phase: str, key: Mapping[str, Any], geometry: Mapping[str, Any],
              gpu: GpuSpec, *, compressed_keys: bool = True) -> WorkModel:
    """DeepSeek-V4 modules and their sparse kernels. Indexer kernels (logits, top-k): the index
    heads score every compressed key, no per-head sharding. Attention: q/o low-rank projections
    (grouped output), q.k and p.v per head over the compressed keys, capped by the top-k in CSA
    layers. ``compressed_keys`` is False for kernel tables whose axes already count compressed
    keys (the sparse-kernel family)."""
    common = common_terms(phase, key, gpu)
    kv_b = bytes_of(key.get("kv_cache_dtype"))
    hidden, q_lora = geo(geometry, "hidden_size", 7168), geo(geometry, "q_lora_rank", 1536)
    d = geo(geometry, "head_dim", 512)
    ratio = float(key.get("compress_ratio") or 1) or 1.0
    topk = geo(geometry, "index_topk", 2048)
    if "logits" in table or "topk" in table:
        return WorkModel(pair_flops_shared=2.0 * geo(geometry, "index_n_heads", 64)
                         * geo(geometry, "index_head_dim", 128),
                         kv_bytes_per_token=geo(geometry, "index_head_dim", 128) * kv_b, compress=ratio, **common)
    o_lora, o_groups = geo(geometry, "o_lora_rank", 1024), geo(geometry, "o_groups", 8)
    proj_shared = hidden * q_lora + hidden * d + o_groups * o_lora * hidden / max(o_groups, 1)
    proj_per_head = q_lora * d + d * o_lora / max(o_groups, 1)
    if table.startswith("glm5"):
        proj_shared, proj_per_head = 0.0, 0.0
    cap = topk if "csa" in table or ratio <= 4 else 0.0
    return WorkModel(proj_shared=proj_shared, proj_per_head=proj_per_head, pair_flops_per_head=4.0 * d,
                     kv_bytes_per_token=d * kv_b, act_bytes_per_token_per_head=2.0 * d * 2.0, cap=cap,
                     compress=ratio if compressed_keys else 1.0, **common)

DSV4 = register(
    Family(
        name="dsv4",
        title="DeepSeek-V4 CSA/HCA attention module",
        tier=Tier.NATIVE_LOCAL,
        native_source=NativeSource.MODEL_CONFIG,
        tables=(
            module_spec("dsv4_csa_context_module", "context", discrete=_DISCRETE),
            module_spec("dsv4_csa_generation_module", "generation", discrete=_DISCRETE),
            module_spec("dsv4_hca_context_module", "context", discrete=_DISCRETE),
            module_spec("dsv4_hca_generation_module", "generation", discrete=_DISCRETE),
        ),
        geometry=DSV4_GEOMETRY,
        requires_model=True,
        requires_tp=True,
        rationale="q/o low-rank projections, output groups, indexer and window are model variables",
        work=dsv4_work,
    )
)
