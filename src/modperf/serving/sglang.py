"""SGLang's serving rules (docs/serving.md cites each default; ``server_args.py``):

* step budget: ``chunked_prefill_size`` 8192 below 160 GB of GPU memory, 16384 from there;
* scheduler: prefill first (a prefill batch runs alone and stalls the decodes; mixed chunks
  are off by default);
* memory: ``mem_fraction_static`` leaves a reserve of 512 MiB + 1.5 MiB per chunk token + 2 MiB
  per CUDA-graph batch + tp / 8 GiB, at least 10 GiB on GPUs above 60 GB;
* running requests: the KV pool alone decides; KV allocated as a request grows; a request is
  admitted when the free pool covers its prompt and the new-token ratio (0.7, decaying to 0.098
  over 600 decode steps) of what the running requests and it may still generate; the newest is
  retracted when a decode step does not fit (``schedule_policy.py``, ``environ.py``);
* CUDA graphs: ``cuda_graph_max_bs`` 256 at tp < 4 and 512 from tp 4 below 160 GB of GPU
  memory, 512 from there.
"""

from __future__ import annotations

from .backend import LARGE_GPU_BYTES, Backend, Fitted, GiB, MiB
from .model import Constants


class SGLang(Backend):
    name = "sglang"
    chunk_tokens = 8192
    chunk_tokens_large_gpu = 16384
    scheduler = "prefill_first"
    max_running = 1 << 20
    reserves_whole_sequence = False
    kv_admission = "new_token_ratio"

    def kv_budget_bytes(self, *, mem_capacity: float, weights: float, other: float, chunk: int,
                        gpus: int) -> float:
        reserved = 512 * MiB + 1.5 * MiB * max(chunk, 2048) + 2 * MiB * 512 + gpus / 8 * GiB
        if mem_capacity > 60e9:
            reserved = max(reserved, 10 * GiB)
        return mem_capacity - reserved - weights

    def graph_max_batch(self, mem_capacity: float, tp: int) -> int:
        if mem_capacity >= LARGE_GPU_BYTES:
            return 512
        return 256 if tp < 4 else 512


# --- fitted constants: written by `python bench/silicon.py --fit` from calibration rows only ---
SGLang.fitted = Fitted(
    sets={
        ("agg", "hopper"): Constants(s_pre=0.9095, s_dec=1.1282, tau0_ms=154.9584, kappa=1.0, host_op_ms=0.0),
        ("agg", "blackwell"): Constants(s_pre=0.7478, s_dec=1.1894, tau0_ms=154.9584, kappa=1.0, host_op_ms=0.0),
        ("agg", "*"): Constants(s_pre=1.0, s_dec=1.0, tau0_ms=154.9584, kappa=1.0, host_op_ms=0.0),
        ("disagg", "*"): Constants(s_pre=0.6999, s_dec=0.8528, tau0_ms=260.0899, kappa=0.2396, host_op_ms=0.0),
    },
    what={
        ("agg", "hopper"): "step fitted on 198 agg rows of hopper; frontend, host floor: 277 agg rows",
        ("agg", "blackwell"): "step fitted on 79 agg rows of blackwell; frontend, host floor: 277 agg rows",
        ("agg", "*"): "physics-only step (too few agg calibration rows on this generation); "
            "frontend, host floor: 277 agg rows",
        ("disagg", "*"): "step and frontend fitted on 91 disagg rows of 4 groups, every backend",
    },
    date="2026-12-03",
)
# --- end of fitted constants ---
