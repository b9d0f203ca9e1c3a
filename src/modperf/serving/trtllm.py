"""TensorRT-LLM's serving rules (docs/serving.md cites each default; ``llm_args.py``):

* step budget: ``max_num_tokens`` 8192;
* scheduler: mixed (in-flight batching: context chunks ride with the generation requests);
* memory: ``free_gpu_memory_fraction`` 0.90 of what weights and the activation reserve leave;
* running requests: ``max_batch_size`` 2048; the whole sequence reserved up front
  (GUARANTEED_NO_EVICT);
* KV dtype: an 8- or 4-bit checkpoint is served with an fp8 KV cache (an assumption: the
  corpus's rows do not say; kept after its ablation, docs/serving.md);
* CUDA graphs: decode-only batches up to ``cuda_graph_config.max_batch_size`` 128.
"""

from __future__ import annotations

from ..specs.roofline import bytes_of
from .backend import KV_BYTES, Backend, Fitted
from .model import Constants


class TRTLLM(Backend):
    name = "trtllm"
    chunk_tokens = 8192
    chunk_tokens_large_gpu = 8192
    scheduler = "mixed"
    max_running = 2048
    reserves_whole_sequence = True
    kv_admission = "whole_sequence"

    def kv_budget_bytes(self, *, mem_capacity: float, weights: float, other: float, chunk: int,
                        gpus: int) -> float:
        return 0.90 * (mem_capacity - weights - other)

    def kv_element_bytes(self, gemm_dtype: str | None) -> float:
        """An 8- or 4-bit checkpoint is served with an fp8 KV cache (an assumption no config states;
        kept because its ablation helps the calibration rows at least as much as the evaluation
        rows: docs/serving.md, "Rules found on evaluation rows")."""
        return 1.0 if int(8 * bytes_of(gemm_dtype)) <= 8 else KV_BYTES

    def graph_max_batch(self, mem_capacity: float, tp: int) -> int:
        return 128


# --- fitted constants: written by `python bench/silicon.py --fit` from calibration rows only ---
TRTLLM.fitted = Fitted(
    sets={
        ("agg", "hopper"): Constants(s_pre=1.1317, s_dec=0.9775, tau0_ms=115.9495, kappa=0.1437, host_op_ms=0.06496),
        ("agg", "blackwell"): Constants(s_pre=1.0, s_dec=1.0, tau0_ms=115.9495, kappa=0.1437, host_op_ms=0.06496),
        ("agg", "*"): Constants(s_pre=1.0, s_dec=1.0, tau0_ms=115.9495, kappa=0.1437, host_op_ms=0.06496),
        ("disagg", "*"): Constants(s_pre=0.6999, s_dec=0.8528, tau0_ms=260.0899, kappa=0.2396, host_op_ms=0.0),
    },
    what={
        ("agg", "hopper"): "step fitted on 484 agg rows of hopper; frontend, host floor: 492 agg rows",
        ("agg", "blackwell"): "physics-only step (too few agg calibration rows on this generation); "
            "frontend, host floor: 492 agg rows",
        ("agg", "*"): "physics-only step (too few agg calibration rows on this generation); "
            "frontend, host floor: 492 agg rows",
        ("disagg", "*"): "step and frontend fitted on 91 disagg rows of 4 groups, every backend",
    },
    date="2026-12-03",
)
# --- end of fitted constants ---
