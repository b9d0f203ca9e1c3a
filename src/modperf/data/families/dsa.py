"""DeepSeek sparse attention module (DeepSeek-V3.2, GLM-5.x): [native][local].

An MLA module plus the lightning indexer, whose cost depends on index_n_heads,
index_head_dim and index_topk. Rows whose ``op_name`` ends in ``_skip_indexer`` measure
layers that reuse a previous layer's top-k (GLM-5.2's shared indexer); ``op_name`` is a key
column, so they never merge with indexer rows. Which layers skip is the model's layer
schedule (index_topk_freq, indexer_types), not the module's geometry.
"""

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ...specs.models import ConfigField
from ...specs.roofline import GpuSpec, WorkModel
from .base import Family, LaneRule, NativeSource, PointTest, Tier, module_spec, register
from .mla_module import MLA_GEOMETRY, mla_module_work


def dsa_work(table: str, phase: str, key: Mapping[str, Any], geometry: Mapping[str, Any],
             gpu: GpuSpec) -> WorkModel:
    """The MLA module's work plus the lightning indexer (modperf.data.families.mla_module)."""
    return mla_module_work(table, phase, key, geometry, gpu, indexer=True)


DSA_GEOMETRY = (
    *MLA_GEOMETRY,
    ConfigField("index_n_heads"),
    ConfigField("index_head_dim"),
    ConfigField("index_topk"),
)

def sglang_context_lanes(lanes: Sequence[str], geometry: Mapping[str, Any]
                         ) -> list[tuple[str, PointTest, str]] | None:
    """SGLang's DSA prefill runs dense MHA while every query can attend to all of its keys
    (isl + cached prefix <= index_topk: the top-k would select everything) and the sparse
    indexer path beyond; the corpus measures the dense lane (``*_dense_mha_*``) exactly where
    isl + step <= 2048 (DeepSeek-V3.2's and GLM-5's index_topk) and one indexer lane per KV
    dtype (``*_flashmla_kv`` for fp8, ``*_flashmla_sparse`` / ``*_trtllm`` otherwise)."""
    dense = [lane for lane in lanes if "_dense_mha" in lane]
    sparse = [lane for lane in lanes if lane not in dense]
    topk = geometry.get("index_topk")
    if len(dense) != 1 or len(sparse) != 1 or not isinstance(topk, int):
        return None
    return [
        (dense[0], lambda p: p["isl"] + p["step"] <= topk,
         f"isl + step <= index_topk ({topk}): SGLang runs dense MHA"),
        (sparse[0], lambda p: p["isl"] + p["step"] > topk,
         f"isl + step > index_topk ({topk}): SGLang runs the indexer lane of this KV dtype"),
    ]


SGLANG_DSA_CONTEXT_LANES = LaneRule(
    "kernel_source", "dense MHA where isl + step <= index_topk, else the indexer lane of the KV dtype",
    sglang_context_lanes)


DSA = register(
    Family(
        name="dsa",
        title="DSA attention module",
        tier=Tier.NATIVE_LOCAL,
        native_source=NativeSource.MODEL_CONFIG,
        tables=(
            replace(module_spec("dsa_context_module", "context"), lane=SGLANG_DSA_CONTEXT_LANES),
            module_spec("dsa_generation_module", "generation"),
        ),
        geometry=DSA_GEOMETRY,
        requires_model=True,
        requires_tp=True,
        rationale="MLA projections plus the indexer's heads, dim and top-k: all outside the local key",
        work=dsa_work,
    )
)
