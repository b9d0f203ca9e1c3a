"""Leave-one-out accuracy of modperf's interpolation on the real corpus.

For sampled grid points of every head-bearing table of the chosen systems: drop the point,
rebuild its group's grid from the rest (the library's own ragged-grid fill, blend and
extrapolation rules), query the point, and compare with the measurement.

- *interior* points have measured neighbours on both sides along every axis their line varies
  on (batch, sequence, prefix): relative error |pred / measured - 1|, n / median / p90.
- *frontier* points are the largest batch or sequence value of their line (the shape a user
  asks for just past the grid): reported separately with signed error, since there modperf
  extrapolates (roofline utilisation held) or fills the ragged edge.

Points at the small end of an axis (batch 1, the smallest isl) are neither. Latencies of 0 ms
(sparse top-k no-ops) are skipped: a relative error is undefined there.

    python bench/accuracy.py                     # h200_sxm, 60 points per table
    python bench/accuracy.py --system all --per-table 20
    python bench/accuracy.py --tables            # also one row per table

Prints tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

import numpy as np

import modperf
from modperf.families import family_of
from modperf.interp import REFUSED
from modperf.query import TableIndex, build_grid, heads_is_axis

FAMILY_ORDER = ("gqa", "mla_kernel", "mla_module", "dsa", "dsv4", "msa", "sparse_kernel")


def classify(keyed: modperf.KeyedTable, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Per point of bucket ``b``: interior mask and frontier mask (see module doc)."""
    lo, hi = int(keyed.offsets[b]), int(keyed.offsets[b + 1])
    spec = keyed.spec
    ax = {a: keyed.axes[a][lo:hi] for a in spec.axes}
    n = hi - lo
    interior = np.ones(n, dtype=bool)
    frontier = np.zeros(n, dtype=bool)
    varying = [a for a in spec.axes if np.unique(ax[a]).size > 1]
    if not varying:
        return np.zeros(n, dtype=bool), frontier
    frontier_axes = {"batch_size", "num_tokens", spec.seq_axis or "isl"}
    for a in varying:
        others = [o for o in spec.axes if o != a]
        key = np.zeros(n, dtype=np.int64)
        for o in others:
            _, inv = np.unique(ax[o], return_inverse=True)
            key = key * (n + 1) + inv
        order = np.lexsort((ax[a], key))
        k = key[order]
        first = np.r_[True, k[1:] != k[:-1]]
        last = np.r_[k[1:] != k[:-1], True]
        has_lo = np.empty(n, dtype=bool)
        has_hi = np.empty(n, dtype=bool)
        has_lo[order] = ~first
        has_hi[order] = ~last
        interior &= has_lo & has_hi
        if a in frontier_axes:
            frontier |= has_lo & ~has_hi
    return interior, frontier & ~interior


def run(systems: list[str] | None, per_table: int, seed: int, families: set[str] | None,
        show_tables: bool) -> int:
    db = modperf.open()
    rng = np.random.default_rng(seed)
    inner: dict[str, list[float]] = defaultdict(list)
    front: dict[str, list[float]] = defaultdict(list)
    refused: dict[str, int] = defaultdict(int)
    per_table_rows = []
    started = time.perf_counter()
    refs = [r for r in db.catalog.select(physical=False) if family_of(r.table) is not None
            and (systems is None or r.system in systems)]
    # a reused slot answers from its donor's file: evaluate each physical file once
    seen = set()
    for ref in sorted(refs, key=lambda r: (r.system, r.backend, r.version, r.table)):
        if ref.path in seen:
            continue
        seen.add(ref.path)
        family = family_of(ref.table)
        if families and family.name not in families:
            continue
        keyed = db.load(ref)
        index = TableIndex.build(keyed)
        heads_axis = heads_is_axis(keyed)
        group_of_bucket = {}
        for g, buckets in index.groups.items():
            for b in buckets:
                group_of_bucket[b] = g
        candidates_in, candidates_fr = [], []
        for b in range(keyed.n_buckets):
            interior, frontier = classify(keyed, b)
            base = int(keyed.offsets[b])
            candidates_in += [(b, base + int(i)) for i in np.flatnonzero(interior)]
            candidates_fr += [(b, base + int(i)) for i in np.flatnonzero(frontier)]
        t_in, t_fr = [], []
        for candidates, sink, table_sink in ((candidates_in, inner, t_in), (candidates_fr, front, t_fr)):
            if not candidates:
                continue
            pick = rng.choice(len(candidates), size=min(per_table, len(candidates)), replace=False)
            for j in sorted(pick):
                b, p = candidates[j]
                measured = float(keyed.latency[p])
                if measured <= 0:
                    continue
                grid = build_grid(index, group_of_bucket[b], ref.system, drop_point=p)
                point = ([int(keyed.bucket_local[b])] if heads_axis else []) + [int(keyed.axes[a][p]) for a in keyed.spec.axes]
                found = grid.lookup(point)
                if found.kind == REFUSED:
                    refused[family.name + (" interior" if sink is inner else " frontier")] += 1
                    continue
                err = found.latency_ms / measured - 1.0
                sink[family.name + "/" + keyed.spec.phase].append(err)
                table_sink.append(err)
        if show_tables and (t_in or t_fr):
            per_table_rows.append((ref.label, t_in, t_fr))
    seconds = time.perf_counter() - started

    def stats(errs: list[float]) -> str:
        if not errs:
            return f"{0:>6d} {'-':>8s} {'-':>8s}"
        e = np.abs(np.asarray(errs))
        return f"{e.size:>6d} {100 * np.median(e):7.2f}% {100 * np.percentile(e, 90):7.2f}%"

    def signed(errs: list[float]) -> str:
        if not errs:
            return f"{0:>6d} {'-':>8s} {'-':>9s} {'-':>9s}"
        e = np.asarray(errs)
        return (f"{e.size:>6d} {100 * np.median(np.abs(e)):7.2f}% {100 * np.median(e):+8.2f}% "
                f"{100 * np.mean(e):+8.2f}%")

    label = ",".join(systems) if systems else "all systems"
    print(f"leave-one-out on {label}: {per_table} interior + {per_table} frontier points per table "
          f"(seed {seed}), {len(seen)} tables, {seconds:.1f} s")
    print(f"\n{'family/phase':28s} {'n':>6s} {'median':>8s} {'p90':>8s}   |  frontier: {'n':>6s} "
          f"{'|median|':>8s} {'median':>9s} {'mean':>9s}")
    keys = sorted(set(inner) | set(front), key=lambda k: (FAMILY_ORDER.index(k.split('/')[0])
                                                          if k.split('/')[0] in FAMILY_ORDER else 99, k))
    for k in keys:
        print(f"{k:28s} {stats(inner[k])}   |  {'':9s} {signed(front[k])}")
    all_in = [e for v in inner.values() for e in v]
    all_fr = [e for v in front.values() for e in v]
    ctx_in = [e for k, v in inner.items() if k.endswith("/context") for e in v]
    gen_in = [e for k, v in inner.items() if not k.endswith("/context") for e in v]
    print(f"{'context tables':28s} {stats(ctx_in)}")
    print(f"{'generation + kernel tables':28s} {stats(gen_in)}")
    print(f"{'OVERALL':28s} {stats(all_in)}   |  {'':9s} {signed(all_fr)}")
    if refused:
        print("refused (beyond the extrapolation limit once the point is dropped): "
              + ", ".join(f"{k} {v}" for k, v in sorted(refused.items())))
    if all_in:
        e = np.abs(np.asarray(all_in))
        med, p90 = 100 * np.median(e), 100 * np.percentile(e, 90)
        print(f"goals: overall median {med:.2f}% vs <= 1.0% ({med / 1.0:.2f}x), p90 {p90:.2f}% vs <= 6% "
              f"({p90 / 6.0:.2f}x)")
    if show_tables:
        print(f"\n{'table':70s} {'n':>6s} {'median':>8s} {'p90':>8s}   |  frontier {'n':>6s} {'|median|':>8s} "
              f"{'median':>9s} {'mean':>9s}")
        for name, t_in, t_fr in per_table_rows:
            print(f"{name:70s} {stats(t_in)}   |  {'':8s} {signed(t_fr)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="h200_sxm", help="system name, comma list, or 'all'")
    parser.add_argument("--per-table", type=int, default=60, help="points sampled per table and class")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", action="append", help="only these families (repeatable)")
    parser.add_argument("--tables", action="store_true", help="print one row per table")
    args = parser.parse_args(argv)
    systems = None if args.system == "all" else args.system.split(",")
    return run(systems, args.per_table, args.seed, set(args.family) if args.family else None, args.tables)


if __name__ == "__main__":
    sys.exit(main())
