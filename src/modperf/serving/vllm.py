"""vLLM's serving rules (docs/serving.md cites each default):

* step budget: ``max_num_batched_tokens`` 8192 (``vllm serve`` on GPUs of 70 GiB and more);
* scheduler: mixed (chunked prefill, decodes first, prefill chunks in the same step);
* memory: ``gpu_memory_utilization`` 0.90 of the GPU, less weights and the activation reserve;
* running requests: ``max_num_seqs`` 1024; KV blocks allocated as a request grows: a request is
  admitted when the blocks of the tokens scheduled now are free; where a step's blocks run out,
  the newest running request is preempted and recomputed later (``vllm/v1/core/sched/scheduler.py``);
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
    kv_admission = "as_needed"

    def kv_budget_bytes(self, *, mem_capacity: float, weights: float, other: float, chunk: int,
                        gpus: int) -> float:
        return 0.90 * mem_capacity - weights - other

    def graph_max_batch(self, mem_capacity: float, tp: int) -> int:
        return min(2 * self.max_running, 512)


# --- fitted constants: written by `python bench/silicon.py --fit` from calibration rows only ---
VLLM.fitted = Fitted(
    sets={
        ("agg", "hopper"): Constants(s_pre=1.0988, s_dec=1.0799, tau0_ms=22.3281, kappa=0.1593, host_op_ms=0.07303),
        ("agg", "blackwell"): Constants(s_pre=1.0188, s_dec=1.1139, tau0_ms=22.3281, kappa=0.1593, host_op_ms=0.07303),
        ("agg", "*"): Constants(s_pre=1.0, s_dec=1.0, tau0_ms=22.3281, kappa=0.1593, host_op_ms=0.07303),
        ("disagg", "*"): Constants(s_pre=0.6999, s_dec=0.8528, tau0_ms=260.0899, kappa=0.2396, host_op_ms=0.0),
    },
    what={
        ("agg", "hopper"): "step fitted on 294 agg rows of hopper; frontend, host floor: 503 agg rows",
        ("agg", "blackwell"): "step fitted on 209 agg rows of blackwell; frontend, host floor: 503 agg rows",
        ("agg", "*"): "physics-only step (too few agg calibration rows on this generation); "
            "frontend, host floor: 503 agg rows",
        ("disagg", "*"): "step and frontend fitted on 91 disagg rows of 4 groups, every backend",
    },
    date="2026-12-03",
)
# --- end of fitted constants ---
