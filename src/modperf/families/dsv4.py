"""DeepSeek-V4 compressed sparse (CSA) and heavily compressed (HCA) attention modules:
[native][local].

Flash (64 native) and Pro (128 native) coexist in one file and their tp chains share local
counts 16/32/64; the module bundles q/o low-rank projections, grouped output, the indexer and
the sliding window, all model variables. The per-layer compress ratio is a key column; which
layer uses which ratio is the model's layer schedule (``compress_ratios``).
"""

from ..models import ConfigField
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
    )
)
