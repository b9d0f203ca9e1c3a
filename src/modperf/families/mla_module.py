"""MLA attention module (DeepSeek-V3/R1, Kimi): [native][local].

The module includes the q/kv down- and up-projections and the output projection, whose shapes
depend on hidden_size and the lora ranks: model variables outside the local key. Two natives
sharding to the same local count (DeepSeek-V3 128 @ tp2 and Kimi-K2 64 @ tp1) are different
modules, so the head axis keys [native][local].
"""

from ..models import ConfigField
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
    )
)
