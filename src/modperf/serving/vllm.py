"""vLLM's serving rules (docs/serving.md cites each default):

* step budget: ``max_num_batched_tokens`` 8192 (``vllm serve`` on GPUs of 70 GiB and more);
* scheduler: mixed (chunked prefill, decodes first, prefill chunks in the same step);
* memory: ``gpu_memory_utilization`` 0.90 of the GPU, less weights and the activation reserve;
* running requests: ``max_num_seqs`` 1024; KV blocks allocated as a request grows;
* CUDA graphs: decode batches up to ``min(2 * max_num_seqs, 512)`` = 512
  (``max_cudagraph_capture_size``).
"""

from __future__ import annotations

from .backend import Backend, Fitted
from .model import Constants


class VLLM(Backend):
    name = "vllm"
    chunk_tokens = 8192
    chunk_tokens_large_gpu = 8192
    scheduler = "mixed"
    max_running = 1024
    reserves_whole_sequence = False

    def kv_budget_bytes(self, *, mem_capacity: float, weights: float, other: float, chunk: int,
                        gpus: int) -> float:
        return 0.90 * mem_capacity - weights - other

    def graph_max_batch(self, mem_capacity: float, tp: int) -> int:
        return min(2 * self.max_running, 512)


# --- fitted constants: written by `python bench/silicon.py --fit` from calibration rows only ---
VLLM.fitted = Fitted(
    sets={
        ("agg", "*"): Constants(s_pre=1.0586, s_dec=1.0024, tau0_ms=33.0999, kappa=0.1543),
        ("disagg", "*"): Constants(s_pre=0.7398, s_dec=0.8419, tau0_ms=258.9075, kappa=0.2203),
    },
    what={
        ("agg", "*"): "step and frontend (sglang 277, trtllm 492, vllm 503 rows; re-exports once)",
        ("disagg", "*"): "step and frontend, shared by every backend (91 rows; re-exports once)",
    },
    date="2026-12-03",
)
# --- end of fitted constants ---
