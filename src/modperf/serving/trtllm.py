"""TensorRT-LLM's serving rules (docs/serving.md cites each default; ``llm_args.py``):

* step budget: ``max_num_tokens`` 8192;
* scheduler: mixed (in-flight batching: context chunks ride with the generation requests);
* memory: ``free_gpu_memory_fraction`` 0.90 of what weights and the activation reserve leave;
* running requests: ``max_batch_size`` 2048; the whole sequence reserved up front
  (GUARANTEED_NO_EVICT);
* KV dtype: the model's (bfloat16); an fp8 KV cache for quantised checkpoints was an
  assumption no config states, dropped after its ablation (docs/serving.md);
* CUDA graphs: decode-only batches up to ``cuda_graph_config.max_batch_size`` 128.
"""

from __future__ import annotations

from .backend import Backend, Fitted
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

    def graph_max_batch(self, mem_capacity: float, tp: int) -> int:
        return 128


# --- fitted constants: written by `python bench/silicon.py --fit` from calibration rows only ---
TRTLLM.fitted = Fitted(
    sets={
        ("agg", "hopper"): Constants(s_pre=1.1353, s_dec=0.9772, tau0_ms=114.8712, kappa=0.1445, host_op_ms=0.06585),
        ("agg", "blackwell"): Constants(s_pre=1.0, s_dec=1.0, tau0_ms=114.8712, kappa=0.1445, host_op_ms=0.06585),
        ("agg", "*"): Constants(s_pre=1.0, s_dec=1.0, tau0_ms=114.8712, kappa=0.1445, host_op_ms=0.06585),
        ("disagg", "*"): Constants(s_pre=0.7398, s_dec=0.8474, tau0_ms=258.9077, kappa=0.2203, host_op_ms=0.0),
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
