"""How fast the request-level simulation runs (modperf.serving.simulate; goal: at least 10^5 requests
simulated per second): real deployments' step grids (priced once from the op tables, timed
apart), closed loops at several concurrencies and open loops, each run long enough to time.

    python bench/simulate.py                 # the table
    python bench/simulate.py --requests 50000

For each case: the grid's pricing time, the requests simulated, the events the engine
handled (steps carrying prefill work, runs of decode steps, idle jumps) per request, the
engine steps those stand for, the CPU time of the run (process time: the machine may be
shared) and requests simulated per CPU second (best of ``--repeat`` runs), and the wall time. The simulation runs with the backend's fitted simulation constants (physics
only where none are fitted). Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time

import modperf
from modperf.serving.percentiles import prepare, run, simulation_constants
from modperf.serving.predict import deployment_from_row, price

QWEN = {"model_path": "Qwen/Qwen3-32B", "system": "h200_sxm", "mode": "agg", "isl": 1024, "osl": 1024, "tp_size": 2}
DEEPSEEK = {"model_path": "deepseek-ai/DeepSeek-V3", "system": "h200_sxm", "mode": "agg", "isl": 2048, "osl": 512,
            "tp_size": 8}
#: (label, deployment, request rate over the deployment or None for the closed loop)
CASES = [
    *((f"Qwen3-32B vllm tp2, closed loop {b}", {**QWEN, "backend": "vllm", "batch_size": b}, None)
      for b in (1, 16, 64, 256)),
    ("Qwen3-32B sglang tp2, closed loop 64", {**QWEN, "backend": "sglang", "batch_size": 64}, None),
    ("Qwen3-32B trtllm tp2, closed loop 64", {**QWEN, "backend": "trtllm", "batch_size": 64}, None),
    ("Qwen3-32B vllm tp2 1024/128, closed loop 128",
     {**QWEN, "osl": 128, "backend": "vllm", "batch_size": 128}, None),
    ("DeepSeek-V3 vllm tp8, closed loop 32", {**DEEPSEEK, "backend": "vllm", "batch_size": 32}, None),
    ("Qwen3-32B vllm tp2, open loop 2 req/s", {**QWEN, "backend": "vllm", "batch_size": 256}, 2.0),
    ("Qwen3-32B sglang tp2, open loop 2 req/s", {**QWEN, "backend": "sglang", "batch_size": 256}, 2.0),
    ("DeepSeek-V3 vllm tp8, open loop 4 req/s", {**DEEPSEEK, "backend": "vllm", "batch_size": 256}, 4.0),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000, help="requests simulated per case (default 100,000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the best is kept (default 3)")
    args = parser.parse_args()
    db = modperf.open()
    print(f"{'case':<48} {'grid ms':>8} {'requests':>9} {'events/req':>10} {'steps/req':>9} {'cpu s':>6} "
          f"{'req/cpu s':>10} {'wall s':>7}")
    slowest = None
    for label, row, rate in CASES:
        dep = deployment_from_row(row)
        start = time.perf_counter()
        prepared = prepare(price(db, dep), request_rate=rate)
        grid_ms = (time.perf_counter() - start) * 1000.0
        constants, _ = simulation_constants(dep)
        best = None
        for _ in range(args.repeat):
            sim = run(prepared, constants, request_rate=rate, requests=args.requests)
            if best is None or sim.stats["cpu_s"] < best.stats["cpu_s"]:
                best = sim
        assert best is not None
        st = best.stats
        per_s = st["requests"] / st["cpu_s"]
        slowest = per_s if slowest is None else min(slowest, per_s)
        print(f"{label:<48} {grid_ms:>8.0f} {st['requests']:>9,} {st['events'] / st['requests']:>10.2f} "
              f"{st['engine_steps'] / st['requests']:>9.1f} {st['cpu_s']:>6.2f} {per_s:>10,.0f} {st['wall_s']:>7.2f}")
        sys.stdout.flush()
    print(f"\nslowest case: {slowest:,.0f} requests simulated per CPU second (goal: at least 100,000)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
