"""TensorRT-LLM's serving rules (docs/serving.md cites each default; ``llm_args.py``):

* step budget: ``max_num_tokens`` 8192;
* scheduler: mixed (in-flight batching: context chunks ride with the generation requests);
* memory: ``free_gpu_memory_fraction`` 0.90 of what weights and the activation reserve leave;
* running requests: ``max_batch_size`` 2048; the whole sequence reserved up front
  (GUARANTEED_NO_EVICT);
* KV dtype: an 8- or 4-bit checkpoint is served with an fp8 KV cache (an assumption: the
  corpus's rows do not say; docs/serving.md reports its ablation);
* CUDA graphs: decode-only batches up to ``cuda_graph_config.max_batch_size`` 128.
"""

from __future__ import annotations

from ..roofline import bytes_of
from .backend import KV_BYTES, Backend, Fitted
from .model import Constants


class TRTLLM(Backend):
    name = "trtllm"
    chunk_tokens = 8192
    chunk_tokens_large_gpu = 8192
    scheduler = "mixed"
    max_running = 2048
    reserves_whole_sequence = True

    def kv_budget_bytes(self, *, mem_capacity: float, weights: float, other: float, chunk: int,
                        gpus: int) -> float:
        return 0.90 * (mem_capacity - weights - other)

    def kv_element_bytes(self, gemm_dtype: str | None) -> float:
        return 1.0 if int(8 * bytes_of(gemm_dtype)) <= 8 else KV_BYTES

    def graph_max_batch(self, mem_capacity: float, tp: int) -> int:
        return 128


# --- fitted constants: written by `python bench/silicon.py --fit` from calibration rows only ---
TRTLLM.fitted = Fitted(
    sets={
        ("agg", "*"): Constants(s_pre=1.1089, s_dec=0.9286, tau0_ms=134.8505, kappa=0.1405),
        ("disagg", "*"): Constants(s_pre=0.7398, s_dec=0.8419, tau0_ms=258.9075, kappa=0.2203),
    },
    what={
        ("agg", "*"): "step and frontend (sglang 277, trtllm 492, vllm 503 rows; re-exports once)",
        ("disagg", "*"): "step and frontend, shared by every backend (91 rows; re-exports once)",
    },
    date="2026-12-03",
)
# --- end of fitted constants ---
