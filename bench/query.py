"""Query speed through the library API.

Per family, on one representative h200_sxm table:

- single queries (``db.query``): half on-grid (measured points), half off-grid (each axis moved
  by a random factor 0.7-1.3, inside the group's range). After one warm-up query (it loads the
  table and builds the grid), the whole set is timed ``--passes`` times with the garbage
  collector off (as ``timeit`` does); a query's time is the median of its passes, which keeps
  scheduler noise of a shared machine out of the tail. Median and p99 are over queries; the
  p99 of every single timing ("raw p99") is printed too.
- vectorised (``db.query_many``): 1M random in-range points of one group, timed ``--passes``
  times after a 10-point warm-up call; the rate is the median call's (the first call's is
  printed too).

    python bench/query.py [--n 2000] [--vector 1000000] [--passes 3]

Goals (issue 3): single <= 20 us median, <= 50 us p99; vectorised >= 5M queries/s. Prints a
table; asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import numpy as np

import modperf

# (family, slot and key) -- one table per family, a group with a full grid
CASES = [
    ("gqa ctx", dict(table="context_attention", system="h200_sxm", backend="vllm", version="0.24.0",
                     kernel_source="vllm_flash_attn_fa3", attn_dtype="bfloat16", kv_cache_dtype="bfloat16",
                     num_key_value_heads=8, head_dim=128, window_size=0, beam_width=1, num_heads=32)),
    ("gqa gen", dict(table="generation_attention", system="h200_sxm", backend="vllm", version="0.24.0",
                     kernel_source="vllm_flash_attn_fa3", attn_dtype="bfloat16", kv_cache_dtype="bfloat16",
                     num_key_value_heads=8, head_dim=128, window_size=0, beam_width=1, num_heads=32)),
    ("mla kernel", dict(table="generation_mla", system="h200_sxm", backend="trtllm", version="1.3.0rc20",
                        num_heads=16)),
    ("mla module", dict(table="mla_context_module", system="h200_sxm", backend="trtllm", version="1.3.0rc20",
                        model="deepseek-ai/DeepSeek-V3", tp_size=8)),
    ("dsa", dict(table="dsa_generation_module", system="h200_sxm", backend="vllm", version="0.24.0",
                 model="deepseek-ai/DeepSeek-V3.2", tp_size=8)),
    ("dsv4", dict(table="dsv4_csa_context_module", system="h200_sxm", backend="sglang", version="0.5.14",
                  model="deepseek-ai/DeepSeek-V4-Pro", tp_size=8)),
    ("msa", dict(table="msa_generation_module", system="h200_sxm", backend="vllm", version="0.24.0",
                 model="MiniMaxAI/MiniMax-M3", tp_size=4)),
]


def complete(db: modperf.Database, fields: dict) -> tuple[dict, dict[str, np.ndarray]]:
    """Fill the remaining categorical keys with the first group the table holds, and return the
    measured points of that group (axis -> values)."""
    keyed = db.table(fields["system"], fields["backend"], fields["version"], fields["table"])
    index = db.queries.index(keyed)
    names = index.group_names
    for group in sorted(index.groups, key=lambda g: -sum(int(keyed.offsets[b + 1] - keyed.offsets[b])
                                                         for b in index.groups[g])):
        key = dict(zip(names, group))
        if all(key.get(k, v) == v for k, v in fields.items() if k in key):
            out = dict(fields)
            out.update({k: v for k, v in key.items() if k in keyed.spec.categorical})
            try:
                db.query(**out, **{a: int(keyed.axes[a][keyed.offsets[index.groups[group][0]]])
                                   for a in keyed.spec.axes})
            except modperf.ModperfError:
                continue
            rows = np.concatenate([np.arange(keyed.offsets[b], keyed.offsets[b + 1]) for b in index.groups[group]])
            return out, {a: keyed.axes[a][rows] for a in keyed.spec.axes}
    raise SystemExit(f"no usable group in {fields['table']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="single queries per family")
    parser.add_argument("--vector", type=int, default=1_000_000, help="points per vectorised call")
    parser.add_argument("--passes", type=int, default=3, help="timed passes (single set and vectorised call)")
    args = parser.parse_args(argv)
    db = modperf.open()
    rng = np.random.default_rng(0)
    print(f"{'family':12s} {'table':26s} {'single median':>14s} {'p99':>9s} {'raw p99':>9s} {'on-grid med':>12s} "
          f"{'off-grid med':>12s} {'vector':>11s} {'first call':>11s}  kinds (vector)")
    all_single, all_rate = [], []
    for name, fields in CASES:
        q, pts = complete(db, fields)
        axes = list(pts)
        # half on-grid (measured points), half off-grid (between measured values of each axis)
        picks = rng.integers(0, pts[axes[0]].size, args.n)
        shapes = []
        for k, p in enumerate(picks):
            shape = {a: int(pts[a][p]) for a in axes}
            if k % 2:
                for a in axes:
                    lo, hi = int(pts[a].min()), int(pts[a].max())
                    if hi > lo:
                        shape[a] = int(min(hi, max(lo, shape[a] * rng.uniform(0.7, 1.3))))
            shapes.append(shape)
        answered = []
        refusals = 0
        for shape in shapes:
            try:
                db.query(**q, **shape)
                answered.append(shape)
            except modperf.ModperfError:
                refusals += 1  # the error path (nearest measured points) is not what is timed
        timings = np.zeros((args.passes, len(answered)))
        gc.disable()
        try:
            for r in range(args.passes):
                for k, shape in enumerate(answered):
                    t0 = time.perf_counter_ns()
                    db.query(**q, **shape)
                    timings[r, k] = (time.perf_counter_ns() - t0) / 1000.0
        finally:
            gc.enable()
        single = np.median(timings, axis=0)
        on_grid = np.array([k % 2 == 0 for k, shape in enumerate(shapes) if shape in answered])
        # vectorised: random in-range points -- a random measured point, each axis moved to a
        # uniform value between it and the next measured value of that axis (ragged grids have
        # no measurements in much of their bounding box, so uniform-in-the-box is mostly refused)
        base = rng.integers(0, pts[axes[0]].size, args.vector)
        cols = {}
        for a in axes:
            vals = np.unique(pts[a])
            here = pts[a][base]
            nxt = vals[np.minimum(np.searchsorted(vals, here) + 1, vals.size - 1)]
            cols[a] = here + (rng.random(args.vector) * (nxt - here + 1)).astype(np.int64).clip(0, None)
            cols[a] = np.minimum(cols[a], nxt)
        db.query_many(**q, **{a: c[:10] for a, c in cols.items()})  # warm
        calls = []
        for _ in range(args.passes):
            t0 = time.perf_counter()
            lat, kinds = db.query_many(**q, **cols)
            calls.append(time.perf_counter() - t0)
        rate = args.vector / float(np.median(calls))
        counts = np.bincount(kinds.astype(np.int64) + 1, minlength=4)
        all_single.append(single)
        all_rate.append(rate)
        print(f"{name:12s} {q['table']:26s} {np.median(single):11.1f} us {np.percentile(single, 99):6.1f} us "
              f"{np.percentile(timings, 99):6.1f} us {np.median(single[on_grid]):9.1f} us "
              f"{np.median(single[~on_grid]):9.1f} us {rate / 1e6:7.2f} M/s {args.vector / calls[0] / 1e6:7.2f} M/s  "
              f"refused {counts[0]}, exact {counts[1]}, interp {counts[2]}, extrap {counts[3]}; single refused {refusals}")
    every = np.concatenate(all_single)
    worst_p99 = max(np.percentile(s_, 99) for s_ in all_single)
    worst_med = max(np.median(s_) for s_ in all_single)
    print(f"{'ALL':12s} {'':26s} {np.median(every):11.1f} us {np.percentile(every, 99):6.1f} us"
          f"{'':38s} {min(all_rate) / 1e6:7.2f} M/s (slowest family)")
    print(f"goals (worst family): single median {worst_med:.1f} us vs <= 20 us ({worst_med / 20:.2f}x), p99 "
          f"{worst_p99:.1f} us vs <= 50 us ({worst_p99 / 50:.2f}x), vectorised {min(all_rate) / 1e6:.2f} M/s vs "
          f">= 5 M/s ({min(all_rate) / 5e6:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
