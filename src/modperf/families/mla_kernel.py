"""MLA attention kernels (the latent-attention core, after projections): local-only.

The kernel tables are collected at one latent geometry for the whole table (kv_lora_rank 512,
qk_rope_head_dim 64, and in context qk_nope_head_dim 128 / v_head_dim 128: the DeepSeek-V3
dims), so within a table the local head count completes the key. Files mix natives (64- and
128-native tp chains); ``modperf check`` measures how closely the chains agree at shared local
counts, the evidence for keeping this family local-only.
"""

from ..models import ConfigField
from .base import Family, NativeSource, TableSpec, Tier, module_spec, register

_KERNEL_CATEGORICAL = ("op_name", "kernel_source", "mla_dtype", "kv_cache_dtype")

MLA_KERNEL = register(
    Family(
        name="mla_kernel",
        title="MLA attention kernel",
        tier=Tier.LOCAL,
        native_source=NativeSource.HEADS_TIMES_TP,
        tables=(
            module_spec("context_mla", "context", categorical=_KERNEL_CATEGORICAL),
            module_spec("generation_mla", "generation", categorical=_KERNEL_CATEGORICAL),
            # wideep files written since sglang 0.5.9 add model/architecture/gemm_type.
            module_spec(
                "wideep_context_mla", "context",
                categorical=(*_KERNEL_CATEGORICAL, "gemm_type"), optional=("gemm_type",),
            ),
            module_spec(
                "wideep_generation_mla", "generation",
                categorical=(*_KERNEL_CATEGORICAL, "gemm_type"), optional=("gemm_type",),
            ),
            TableSpec(
                "mla_bmm", "kernel", ("op_name", "kernel_source", "bmm_dtype"), (), ("num_tokens",), None
            ),
        ),
        # The dims the kernel reads; constant within a table (see the module docstring).
        geometry=(
            ConfigField("kv_lora_rank"),
            ConfigField("qk_rope_head_dim"),
            ConfigField("qk_nope_head_dim"),
            ConfigField("v_head_dim"),
        ),
        rationale=(
            "the kernel runs the local heads against a latent cache whose dims are fixed for the "
            "whole table; no model variable outside the key changes the launch"
        ),
        notes={"kernel_dims": {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}},
    )
)
