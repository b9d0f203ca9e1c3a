"""MLA attention kernels (the latent-attention core, after projections): local-only.

The kernel tables are collected at one latent geometry for the whole table (kv_lora_rank 512,
qk_rope_head_dim 64, and in context qk_nope_head_dim 128 / v_head_dim 128: the DeepSeek-V3
dims), so within a table the local head count completes the key. Files mix natives (64- and
128-native tp chains); ``modperf check`` measures how closely the chains agree at shared local
counts, the evidence for keeping this family local-only.
"""

from collections.abc import Mapping
from typing import Any

from ...specs.models import ConfigField
from ...specs.roofline import GpuSpec, WorkModel, bytes_of, common_terms, geo
from .base import Family, NativeSource, TableSpec, Tier, module_spec, register

_KERNEL_CATEGORICAL = ("op_name", "kernel_source", "mla_dtype", "kv_cache_dtype")



def mla_kernel_work(table: str, phase: str, key: Mapping[str, Any], geometry: Mapping[str, Any],
                    gpu: GpuSpec) -> WorkModel:
    """mla_bmm: per-token, per-head latent projections. Context: non-absorbed attention (q.k
    over nope + rope, p.v over v). Decode: absorbed, every head reads the shared latent cache."""
    common = common_terms(phase, key, gpu)
    kv_b = bytes_of(key.get("kv_cache_dtype"))
    kv_lora = geo(geometry, "kv_lora_rank", 512)
    nope, rope, v = geo(geometry, "qk_nope_head_dim", 128), geo(geometry, "qk_rope_head_dim", 64), \
        geo(geometry, "v_head_dim", 128)
    if table == "mla_bmm":
        return WorkModel(token_flops_per_head=2.0 * nope * kv_lora, proj_per_head=nope * kv_lora,
                         act_bytes_per_token_per_head=(nope + kv_lora) * 2.0, **common)
    if phase == "context":
        return WorkModel(pair_flops_per_head=2.0 * (nope + rope + v),
                         kv_bytes_per_token_per_head=(nope + v) * kv_b, kv_bytes_per_token=rope * kv_b,
                         act_bytes_per_token_per_head=(nope + rope + v) * 2.0, **common)
    return WorkModel(pair_flops_per_head=2.0 * (kv_lora + rope + kv_lora), kv_bytes_per_token=(kv_lora + rope) * kv_b,
                     act_bytes_per_token_per_head=(kv_lora + rope) * 2.0, **common)


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
        work=mla_kernel_work,
        notes={"kernel_dims": {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                               "v_head_dim": 128}},
    )
)
