"""Estimate benchmark: a 4-tp estimate of 61-layer models in a warm process, and the cold
`modperf estimate` command (a fresh process: interpreter start, imports, catalog scan, table
loads). Prints a table; asserts nothing.

    python bench/estimate.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import modperf
from modperf.model.estimate import estimate

CASES = [
    # (model, system, backend, layers)
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", "vllm", 61),
    ("deepseek-ai/DeepSeek-V4-Pro", "b200_sxm", "sglang", 61),
    ("deepseek-ai/DeepSeek-V3.2", "h200_sxm", "sglang", 61),
    ("meta-llama/Meta-Llama-3.1-70B", "h200_sxm", "trtllm", 80),
]
SHAPE = dict(tps=(1, 2, 4, 8), isl=2048, osl=1024, batch=4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    print(f"{'model':<32} {'system/backend':<18} {'layers':>6} {'warm median ms':>15} {'warm p90 ms':>12} "
          f"{'first call ms':>14} {'cold cmd s':>11}")
    for model, system, backend, layers in CASES:
        db = modperf.open()
        t0 = time.perf_counter()
        estimate(db, model=model, system=system, backend=backend, **SHAPE)  # loads tables, builds grids
        first = time.perf_counter() - t0
        runs = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            estimate(db, model=model, system=system, backend=backend, **SHAPE)
            runs.append(time.perf_counter() - t0)
        runs.sort()
        cold = []
        for _ in range(5):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "modperf", "estimate", "--model", model, "--system", system,
                            "--backend", backend, "--tp", "1,2,4,8", "--isl", "2048", "--osl", "1024", "--batch", "4",
                            "--json"], check=True, capture_output=True)
            cold.append(time.perf_counter() - t0)
        print(f"{model:<32} {system + '/' + backend:<18} {layers:>6} {1e3 * statistics.median(runs):>15.2f} "
              f"{1e3 * runs[int(0.9 * (len(runs) - 1))]:>12.2f} {1e3 * first:>14.1f} {statistics.median(cold):>11.2f}")
    print("goals: warm 4-tp estimate of a 61-layer model < 0.5 s; cold command < 2 s (median of 5 fresh processes)")
    whole_model(args.repeat)
    composed_agreement()


#: The whole model's step (scope model): four tp sizes, a prefill and a decode step each.
WHOLE = [
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", "vllm"),
    ("Qwen/Qwen3.5-397B-A17B", "h200_sxm", "sglang"),
    ("meta-llama/Meta-Llama-3.1-70B", "h200_sxm", "trtllm"),
]


def whole_model(repeat: int) -> None:
    from modperf.model.step import DecodePart, Parallel, SeqChunk, step_cost

    print()
    print(f"{'whole model (scope model)':<32} {'system/backend':<18} {'warm 4 tp ms':>13} {'warm p90 ms':>12} "
          f"{'first ms':>9} {'cold cmd s':>11}")
    for model, system, backend in WHOLE:
        db = modperf.open()

        def four() -> None:
            for tp in (1, 2, 4, 8):
                par = Parallel(tp=tp)
                step_cost(db, model=model, system=system, backend=backend, parallel=par, prefill=SeqChunk(4, 2048))
                step_cost(db, model=model, system=system, backend=backend, parallel=par, decode=DecodePart(4, 2560))

        t0 = time.perf_counter()
        four()
        first = time.perf_counter() - t0
        runs = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            four()
            runs.append(time.perf_counter() - t0)
        runs.sort()
        cold = []
        for _ in range(5):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "modperf", "estimate", "--scope", "model", "--model", model,
                            "--system", system, "--backend", backend, "--tp", "1,2,4,8", "--isl", "2048", "--osl",
                            "1024", "--batch", "4", "--json"], capture_output=True)
            cold.append(time.perf_counter() - t0)
        print(f"{model:<32} {system + '/' + backend:<18} {1e3 * statistics.median(runs):>13.2f} "
              f"{1e3 * runs[int(0.9 * (len(runs) - 1))]:>12.2f} {1e3 * first:>9.1f} {statistics.median(cold):>11.2f}")
    print("goals: whole model, prefill + decode at 4 tp sizes warm < 50 ms; cold `modperf estimate` < 2 s")


#: Where MLA module tables and the kernel, bmm and GEMM tables they can be composed from coexist.
BOTH = [(s, "trtllm", "1.3.0rc20") for s in ("b200_sxm", "b300_sxm", "gb200", "gb300", "h100_sxm", "h200_sxm",
                                            "rtx_pro_6000_server")]


def composed_agreement() -> None:
    """Composed MLA layers (kernel + bmm + GEMMs) against the module tables measured as a whole."""
    db = modperf.open()
    ratios: dict[str, list[float]] = {"prefill": [], "decode": []}
    for system, backend, version in BOTH:
        for batch, isl, osl in ((1, 1024, 256), (8, 2048, 1024), (32, 4096, 512)):
            common = dict(model="deepseek-ai/DeepSeek-V3", system=system, backend=backend, version=version,
                          tps=(1, 2, 4, 8), isl=isl, osl=osl, batch=batch)
            module = estimate(db, **common, mla="module")
            composed = estimate(db, **common, mla="composed")
            for m, c in zip(module.tps, composed.tps):
                for phase in ("prefill", "decode"):
                    a, b = getattr(m, f"{phase}_ms"), getattr(c, f"{phase}_ms")
                    if a and b:
                        ratios[phase].append(b / a)
    print()
    print("composed MLA / MLA module table, DeepSeek-V3, 7 trtllm 1.3.0rc20 slots, tp 1/2/4/8, 3 shapes")
    print(f"{'phase':<8} {'pairs':>5} {'median':>7} {'p10':>6} {'p90':>6} {'min':>6} {'max':>6}")
    for phase, values in ratios.items():
        v = sorted(values)
        print(f"{phase:<8} {len(v):>5} {statistics.median(v):>7.3f} {v[len(v) // 10]:>6.3f} "
              f"{v[9 * len(v) // 10]:>6.3f} {v[0]:>6.3f} {v[-1]:>6.3f}")


if __name__ == "__main__":
    main()
