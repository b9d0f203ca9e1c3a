"""DeepSeek sparse attention module (DeepSeek-V3.2, GLM-5.x): [native][local].

An MLA module plus the lightning indexer, whose cost depends on index_n_heads,
index_head_dim and index_topk. Rows whose ``op_name`` ends in ``_skip_indexer`` measure
layers that reuse a previous layer's top-k (GLM-5.2's shared indexer); ``op_name`` is a key
column, so they never merge with indexer rows. Which layers skip is the model's layer
schedule (index_topk_freq, indexer_types), not the module's geometry.
"""

from collections.abc import Mapping
from typing import Any

from ..models import ConfigField
from ..roofline import GpuSpec, WorkModel
from .base import Family, NativeSource, Tier, module_spec, register
from .mla_module import MLA_GEOMETRY, mla_module_work


def dsa_work(table: str, phase: str, key: Mapping[str, Any], geometry: Mapping[str, Any],
             gpu: GpuSpec) -> WorkModel:
    """The MLA module's work plus the lightning indexer (modperf.families.mla_module)."""
    return mla_module_work(table, phase, key, geometry, gpu, indexer=True)


DSA_GEOMETRY = (
    *MLA_GEOMETRY,
    ConfigField("index_n_heads"),
    ConfigField("index_head_dim"),
    ConfigField("index_topk"),
)

DSA = register(
    Family(
        name="dsa",
        title="DSA attention module",
        tier=Tier.NATIVE_LOCAL,
        native_source=NativeSource.MODEL_CONFIG,
        tables=(
            module_spec("dsa_context_module", "context"),
            module_spec("dsa_generation_module", "generation"),
        ),
        geometry=DSA_GEOMETRY,
        requires_model=True,
        requires_tp=True,
        rationale="MLA projections plus the indexer's heads, dim and top-k: all outside the local key",
        work=dsa_work,
    )
)
