"""Leave-one-out accuracy of modperf's interpolation on the real corpus.

For sampled grid points of every table of the chosen systems: drop the point, rebuild its
group's grid from the rest (``query.build_grid``: the library's own fitted coordinates,
ragged-grid fill, blend and extrapolation rules), query the point (``Grid.lookup``, the path
``db.query`` takes), and compare with the measurement. Nothing is tuned on the held-out point.

- *interior* points have measured neighbours on both sides along every axis their bucket's
  line varies on (batch, sequence, prefix): relative error |pred / measured - 1|, n / median /
  p90. Dropping one point leaves a hole in the lattice: this measures the fill of a missing
  cell (axis estimates combined by their expected errors).
- *off-lattice* points: the same kind of point, but its whole lattice plane along one axis is
  dropped (every point of the group with that batch, isl, step or local head count; the axis
  cycles over the point's varying axes and, where it is not at an end, local heads), so the
  query falls between lattice values: this measures the blend a user's off-grid query gets
  (at twice the measured spacing).
- *frontier* points are the largest batch or sequence value of their line (the shape a user
  asks for just past the grid): reported separately with signed error, since there modperf
  extrapolates (roofline utilisation held) or fills the ragged edge.

Side by side with the best tool (aiconfigurator-core, driven in a child process by
bench/aiconfigurator_side.py): for the same interior points, the tool answers from the same table
without the point (written to a temporary systems root in its layout), through the op its model
code builds for that table. A point counts for the tool where its full-table answer is the stored
value (so its op addresses exactly that row) and its held-out answer does not come from another
stored row at the same coordinates; both sides' errors are then taken on the points both
answered. Tables it cannot be asked for, or never answers with the stored value, say why.

Points at the small end of an axis (batch 1, the smallest isl) are neither. Latencies of 0 ms
(sparse top-k no-ops) are skipped: a relative error is undefined there. OVERALL and the
context / generation lines count the tables with the model's head axis (attention) only; the
other families' tables (GEMMs, MoE, communication, ...) are reported on their own lines. The sample is drawn
per table (the same number from each), so every table weighs the same.

    python bench/accuracy.py                     # h200_sxm: 200 interior, 60 off-lattice, 60 frontier per table
    python bench/accuracy.py --system all --per-table 40 --off-lattice 10 --frontier 10
    python bench/accuracy.py --tables            # also one row per table
    python bench/accuracy.py --no-tool           # modperf only (the tool comparison takes minutes)

Prints tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

import numpy as np
from aiconfigurator_side import Tool, ToolAnswers, held_out_answers

import modperf
from modperf.data.families import family_of
from modperf.query.engine import TableIndex, build_grid, heads_is_axis
from modperf.query.interp import REFUSED

FAMILY_ORDER = ("gqa", "mla_kernel", "mla_module", "dsa", "dsv4", "msa", "sparse_kernel", "gemm")


def classify(keyed: modperf.KeyedTable, b: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Per point of bucket ``b``: interior mask, frontier mask (see module doc), and the axes
    the bucket varies on."""
    lo, hi = int(keyed.offsets[b]), int(keyed.offsets[b + 1])
    spec = keyed.spec
    ax = {a: keyed.axes[a][lo:hi] for a in spec.axes}
    n = hi - lo
    interior = np.ones(n, dtype=bool)
    frontier = np.zeros(n, dtype=bool)
    varying = [a for a in spec.axes if np.unique(ax[a]).size > 1]
    if not varying:
        return np.zeros(n, dtype=bool), frontier, varying
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
    return interior, frontier & ~interior, varying


def run(systems: list[str] | None, per_table: int, off_lattice: int, frontier: int, seed: int,
        families: set[str] | None, show_tables: bool, tool_python: str | None = None) -> int:
    db = modperf.open()
    tool = Tool(tool_python) if tool_python != "" else None
    if tool is not None and not tool.ready:
        print(f"aiconfigurator-core not available to {tool_python or sys.executable}: {tool.error}")
        tool.close()
        tool = None
    versus = []  # (label, table, head-bearing, [(measured, modperf answer)], ToolAnswers)
    tool_seconds = 0.0
    rng = np.random.default_rng(seed)
    inner: dict[str, list[float]] = defaultdict(list)
    plane: dict[str, list[float]] = defaultdict(list)
    front: dict[str, list[float]] = defaultdict(list)
    refused: dict[str, int] = defaultdict(int)
    rows_out = []  # (label, family/phase, model head axis, interior errs, off-lattice errs, frontier errs)
    started = time.perf_counter()
    refs = [r for r in db.catalog.select(physical=False) if family_of(r.table) is not None
            and (systems is None or r.system in systems)]
    seen = set()  # a reused slot answers from its donor's file: evaluate each physical file once
    builds = 0
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
        group_of_bucket = {b: g for g, buckets in index.groups.items() for b in buckets}
        cand_in, cand_fr = [], []
        varying_of = {}
        for b in range(keyed.n_buckets):
            interior, front_mask, varying = classify(keyed, b)
            varying_of[b] = varying
            base = int(keyed.offsets[b])
            cand_in += [(b, base + int(i)) for i in np.flatnonzero(interior)]
            cand_fr += [(b, base + int(i)) for i in np.flatnonzero(front_mask)]
        key = family.name + "/" + keyed.spec.phase
        t_in, t_pl, t_fr = [], [], []

        def predict(b: int, p: int, drop: int | np.ndarray) -> float | None:
            grid = build_grid(index, group_of_bucket[b], ref.system, drop_point=drop)
            point = ([int(keyed.bucket_local[b])] if heads_axis else []) + [int(keyed.axes[a][p]) for a in keyed.spec.axes]
            found = grid.lookup(point)
            return None if found.kind == REFUSED else found.latency_ms

        def group_rows(b: int) -> np.ndarray:
            return np.concatenate([np.arange(keyed.offsets[c], keyed.offsets[c + 1]) for c in index.groups[group_of_bucket[b]]])

        def record(got, measured, kind, per_family, per_table_errors):
            """One prediction into its sinks (family and table), or a refusal count."""
            if got is None:
                refused[f"{key} {kind}"] += 1
            else:
                per_family[key].append(got / measured - 1.0)
                per_table_errors.append(got / measured - 1.0)

        pick_in = rng.permutation(len(cand_in))[:per_table] if cand_in else []
        held = []  # (bucket, point, measured, modperf's answer) of the interior points
        for j, c in enumerate(pick_in):
            b, p = cand_in[c]
            measured = float(keyed.latency[p])
            if measured <= 0:
                continue
            builds += 1
            got = predict(b, p, p)
            held.append((b, p, measured, got))
            record(got, measured, "interior", inner, t_in)
            if j >= off_lattice:
                continue
            # off-lattice: drop the point's whole lattice plane along one of its axes
            axes = list(varying_of[b])
            rows = group_rows(b)
            if heads_axis:
                locals_ = np.unique(keyed.bucket_local[index.groups[group_of_bucket[b]]])
                if locals_.size >= 3 and locals_[0] < keyed.bucket_local[b] < locals_[-1]:
                    axes.append("num_heads")
            a = axes[j % len(axes)]
            if a == "num_heads":
                bucket_of_row = np.searchsorted(keyed.offsets, rows, side="right") - 1
                drop = rows[keyed.bucket_local[bucket_of_row] == keyed.bucket_local[b]]
            else:
                drop = rows[keyed.axes[a][rows] == keyed.axes[a][p]]
            builds += 1
            record(predict(b, p, drop), measured, "off-lattice", plane, t_pl)
        pick_fr = rng.permutation(len(cand_fr))[:frontier] if cand_fr else []
        for c in pick_fr:
            b, p = cand_fr[c]
            measured = float(keyed.latency[p])
            if measured <= 0:
                continue
            builds += 1
            record(predict(b, p, p), measured, "frontier", front, t_fr)
        rows_out.append((ref.label, key, family.model_head_axis, t_in, t_pl, t_fr))
        if tool is not None and held:
            t0 = time.perf_counter()
            answers = held_out_answers(tool, db, keyed, [(b, p) for b, p, _, _ in held])
            tool_seconds += time.perf_counter() - t0
            versus.append((ref.label, ref.table, family.model_head_axis, [(m, g) for _, _, m, g in held], answers))
    seconds = time.perf_counter() - started - tool_seconds
    if tool is not None:
        tool.close()

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

    attention = {k: hb for _, k, hb, *_ in rows_out}
    label = ",".join(systems) if systems else "all systems"
    print(f"leave-one-out on {label}: up to {per_table} interior ({off_lattice} of them also off-lattice) and "
          f"{frontier} frontier points per table (seed {seed}), {len(rows_out)} tables, {builds} grid builds, "
          f"{seconds:.1f} s")
    print(f"\n{'family/phase':24s} {'interior n':>10s} {'median':>8s} {'p90':>8s} | {'off-lattice n':>13s} "
          f"{'median':>8s} {'p90':>8s} | {'frontier n':>10s} {'|median|':>8s} {'median':>9s} {'mean':>9s}")
    keys = sorted(set(inner) | set(front) | set(plane), key=lambda k: (
        FAMILY_ORDER.index(k.split("/")[0]) if k.split("/")[0] in FAMILY_ORDER else 99, k))
    for k in keys:
        print(f"{k:24s} {stats(inner[k]):>28s} | {stats(plane[k]):>31s} | {signed(front[k]):>38s}")

    def pool(d: dict[str, list[float]], where) -> list[float]:
        return [e for k, v in d.items() if attention.get(k, True) and where(k) for e in v]

    print()
    for name, where in (("context tables", lambda k: k.endswith("/context")),
                        ("generation + kernel tables", lambda k: not k.endswith("/context")),
                        ("OVERALL (model head axis)", lambda k: True)):
        print(f"{name:24s} {stats(pool(inner, where)):>28s} | {stats(pool(plane, where)):>31s} | "
              f"{signed(pool(front, where)):>38s}")
    others = [k for k in keys if not attention.get(k, True)]
    for k in others:
        print(f"{k + ' (not in OVERALL)':24s} {stats(inner[k]):>28s} | {stats(plane[k]):>31s}")
    if refused:
        print("refused (beyond the extrapolation limit once the points are dropped): "
              + ", ".join(f"{k} {v}" for k, v in sorted(refused.items())))
    biases = [(np.median(t_fr), lbl) for lbl, _, hb, _, _, t_fr in rows_out if hb and len(t_fr) >= 5]
    if biases:
        lo, hi = min(biases), max(biases)
        print(f"frontier bias (median signed error) per table: {100 * lo[0]:+.2f}% ({lo[1]}) to "
              f"{100 * hi[0]:+.2f}% ({hi[1]})")
    all_in = pool(inner, lambda k: True)
    if all_in:
        e = np.abs(np.asarray(all_in))
        med, p90 = 100 * np.median(e), 100 * np.percentile(e, 90)
        print(f"goals: overall interior median {med:.2f}% vs <= 1.0% ({med / 1.0:.2f}x), p90 {p90:.2f}% vs <= 6% "
              f"({p90 / 6.0:.2f}x)")

    def table_row(lbl: str, t_in: list[float], t_pl: list[float], t_fr: list[float]) -> str:
        return f"{lbl:68s} {stats(t_in):>24s} | {stats(t_pl):>24s} | {signed(t_fr):>36s}"

    header = (f"{'table':68s} {'interior n':>10s} {'median':>6s} {'p90':>6s} | {'off-lat n':>9s} {'median':>6s} "
              f"{'p90':>6s} | {'frontier n':>10s} {'|med|':>6s} {'median':>8s} {'mean':>8s}")
    ranked = sorted((r for r in rows_out if r[3]), key=lambda r: -np.percentile(np.abs(r[3]), 90))
    print("\nworst tables by interior p90:\n" + header)
    for lbl, _, hb, t_in, t_pl, t_fr in ranked[:8]:
        print(table_row(lbl + ("" if hb else " (not in OVERALL)"), t_in, t_pl, t_fr))
    if show_tables:
        print("\nevery table:\n" + header)
        for lbl, _, hb, t_in, t_pl, t_fr in rows_out:
            print(table_row(lbl, t_in, t_pl, t_fr))
    if tool is not None:
        print_versus(versus, tool.version, tool_seconds)
    return 0


def print_versus(versus: list[tuple[str, str, bool, list[tuple[float, float | None]], ToolAnswers]],
                 version: str | None, seconds: float) -> None:
    """modperf and the tool on the same held-out points: per table file, per table name
    (pooled over backends and versions) and overall (head-bearing tables)."""

    def errors(pairs: list[tuple[float, float | None]], answers: ToolAnswers) -> tuple[list[float], list[float]]:
        mp, tl = [], []
        for (measured, got), theirs, status in zip(pairs, answers.latency, answers.status):
            if got is not None and status == "ok":
                mp.append(abs(got / measured - 1.0))
                tl.append(abs(theirs / measured - 1.0))
        return mp, tl

    def cell(e: list[float]) -> str:
        if not e:
            return f"{'-':>7s} {'-':>7s}"
        a = np.asarray(e)
        return f"{100 * np.median(a):6.2f}% {100 * np.percentile(a, 90):6.2f}%"

    def verdict(mp: list[float], tl: list[float]) -> str:
        """Whether modperf's median and p90 are at or below the tool's; where not, whether
        the gap is beyond sampling noise: a paired bootstrap (2000 resamples of the points)
        of modperf's minus the tool's statistic, its 5-95 % interval."""
        if not mp:
            return ""
        m, t = np.asarray(mp), np.asarray(tl)
        worse = [(name, q) for name, q in (("median", 50), ("p90", 90)) if np.percentile(m, q) > np.percentile(t, q)]
        if not worse:
            return "modperf <= tool"
        rng = np.random.default_rng(0)
        picks = rng.integers(0, m.size, (2000, m.size))
        notes = []
        for name, q in worse:
            diff = np.percentile(m[picks], q, axis=1) - np.percentile(t[picks], q, axis=1)
            lo, hi = np.percentile(diff, [5, 95]) * 100
            notes.append(f"{name} +{100 * (np.percentile(m, q) - np.percentile(t, q)):.2f} pt "
                         f"(5-95 %: {lo:+.2f}..{hi:+.2f})")
        noise = all(np.percentile(np.percentile(m[picks], q, axis=1) - np.percentile(t[picks], q, axis=1), 5) <= 0
                    for _, q in worse)
        return ("tool lower, within noise: " if noise else "TOOL BETTER: ") + ", ".join(notes)

    print(f"\nmodperf vs aiconfigurator-core {version}: the same held-out interior points, each side answering from "
          f"the table without the point ({seconds:.0f} s for the tool). held: points held out; answered: by modperf / "
          "by the tool (its full-table answer is the stored value, its held-out answer is not another stored row); "
          "errors on the points both answered.")
    header = (f"{'table':66s} {'held':>5s} {'mp n':>5s} {'tool n':>6s} | {'modperf med':>11s} {'p90':>7s} | "
              f"{'tool med':>8s} {'p90':>7s} |")
    print(header)
    by_name: dict[str, tuple[list[float], list[float], bool]] = {}
    overall_mp, overall_tl = [], []
    for label, table, model_head_axis, pairs, answers in versus:
        mp, tl = errors(pairs, answers)
        answered_mp = sum(1 for _, g in pairs if g is not None)
        extra = []
        for status in ("unmapped", "refused", "sibling"):
            if answers.count(status):
                extra.append(f"{answers.count(status)} {status}")
        note = "; ".join(x for x in (verdict(mp, tl), answers.note, ", ".join(extra)) if x)
        print(f"{label:66s} {len(pairs):>5d} {answered_mp:>5d} {answers.count('ok'):>6d} | {cell(mp):>19s} | "
              f"{cell(tl):>16s} | {note}")
        pool = by_name.setdefault(table, ([], [], model_head_axis))
        pool[0].extend(mp)
        pool[1].extend(tl)
        if model_head_axis:
            overall_mp.extend(mp)
            overall_tl.extend(tl)
    print(f"\n{'table name (pooled)':30s} {'both n':>6s} | {'modperf med':>11s} {'p90':>7s} | {'tool med':>8s} "
          f"{'p90':>7s} |")
    for table, (mp, tl, _) in sorted(by_name.items()):
        if mp:
            print(f"{table:30s} {len(mp):>6d} | {cell(mp):>19s} | {cell(tl):>16s} | {verdict(mp, tl)}")
    print(f"{'OVERALL (head-bearing)':30s} {len(overall_mp):>6d} | {cell(overall_mp):>19s} | {cell(overall_tl):>16s} | "
          f"{verdict(overall_mp, overall_tl)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", default="h200_sxm", help="system name, comma list, or 'all'")
    parser.add_argument("--per-table", type=int, default=200, help="interior points sampled per table")
    parser.add_argument("--off-lattice", type=int, default=60,
                        help="of those, how many are also predicted with their lattice plane dropped")
    parser.add_argument("--frontier", type=int, default=60, help="frontier points sampled per table")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", action="append", help="only these families (repeatable)")
    parser.add_argument("--tables", action="store_true", help="print one row per table")
    parser.add_argument("--no-tool", action="store_true", help="skip the side-by-side with aiconfigurator-core")
    parser.add_argument("--tool-python", default=None,
                        help="interpreter with aiconfigurator-core installed (default: this one)")
    args = parser.parse_args(argv)
    systems = None if args.system == "all" else args.system.split(",")
    return run(systems, args.per_table, args.off_lattice, args.frontier, args.seed,
               set(args.family) if args.family else None, args.tables, "" if args.no_tool else args.tool_python)


if __name__ == "__main__":
    sys.exit(main())
