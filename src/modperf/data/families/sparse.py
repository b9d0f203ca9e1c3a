"""Sparse-kernel tables (DeepSeek-V4 and GLM-5 indexer/attention kernels): native-keyed by
contract.

These tables record the model's *native* head count in ``num_heads`` on every row, whatever
the tp_size (some add ``local_num_heads``). That is the contract since the DeepSeek-V4
rank-local migration left them untouched, so they are exempt from the stale-fingerprint guard
(a constant num_heads across tp is their normal shape); instead every row must carry exactly
its model's native count, and tp_size is an ordinary key column.
"""

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ...specs.roofline import GpuSpec, WorkModel
from .base import Family, NativeSource, TableSpec, Tier, register
from .dsa import DSA_GEOMETRY
from .dsv4 import DSV4_GEOMETRY, dsv4_work


def sparse_kernel_work(table: str, phase: str, key: Mapping[str, Any], geometry: Mapping[str, Any],
                       gpu: GpuSpec) -> WorkModel:
    """DeepSeek-V4's work model (modperf.data.families.dsv4), keys counted as stored."""
    return dsv4_work(table, phase, key, geometry, gpu, compressed_keys=False)


_CATEGORICAL = ("op_name", "kernel_source", "mla_dtype", "kv_cache_dtype", "gemm_type", "score_mode")
_DISCRETE = ("tp_size", "compress_ratio", "local_num_heads")
_OPTIONAL = frozenset({"score_mode", "local_num_heads"})
_AXES = ("batch_size", "isl", "step")


def topk_is_noop(columns: Mapping[str, np.ndarray], per_row: Callable[[str], np.ndarray]) -> np.ndarray:
    """A top-k over no more candidates than k selects everything: the kernel is skipped and
    the collector records 0 ms. Candidates are the compressed kv entries,
    (isl + step) // compress_ratio; k is the model's index_topk."""
    candidates = (columns["isl"] + columns["step"]) // columns["compress_ratio"]
    return candidates <= per_row("index_topk")


_TOPK_NOTE = "0 ms where (isl + step) // compress_ratio <= index_topk: nothing to select"


def _spec(name: str, geometry, phase: str = "kernel", zero=None, note=None) -> TableSpec:
    return TableSpec(
        name, phase, _CATEGORICAL, _DISCRETE, _AXES, "step", _OPTIONAL, geometry, zero, note
    )


SPARSE_KERNEL = register(
    Family(
        name="sparse_kernel",
        title="Sparse-attention kernels (native-keyed)",
        tier=Tier.NATIVE,
        native_source=NativeSource.MODEL_CONFIG,
        tables=(
            _spec("dsv4_paged_mqa_logits_module", DSV4_GEOMETRY),
            _spec("dsv4_hca_attn_module", DSV4_GEOMETRY),
            _spec("dsv4_csa_topk_calib", DSV4_GEOMETRY, zero=topk_is_noop, note=_TOPK_NOTE),
            _spec("glm5_dsa_attn_module", DSA_GEOMETRY),
            _spec("glm5_mqa_logits_module", DSA_GEOMETRY),
            _spec("glm5_topk_module", DSA_GEOMETRY, zero=topk_is_noop, note=_TOPK_NOTE),
        ),
        geometry=DSV4_GEOMETRY,
        requires_model=True,
        requires_tp=True,
        stale_guard=False,
        rationale="num_heads is the native count by contract; tp_size is an ordinary key",
        work=sparse_kernel_work,
    )
)
