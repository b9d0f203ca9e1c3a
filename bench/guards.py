"""The data behind every declared guard: per table and guard, what the corpus measures.

For each file of the families that declare data guards (docs/families.md), the statistic each
guard bounds, measured on the loaded table: the median latency ratio and pair count of every
``Scaling`` guard, the median spread of duplicated keys (``DuplicateSpread``), the highest
utilisation of the bounded roofline component (``Ceiling``), the smallest latency in ms
(``LatencyFloor``), and the key groups a ``ShardedKey`` fingerprint flags (its count: the
groups whose column is measured at two or more shard sizes). Printed per table and guard over
files: how many files measure it, and the minimum / median / maximum of the statistic, with the
bound it is held to.

    python bench/guards.py                 # every family with data guards
    python bench/guards.py --family moe    # one family
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import numpy as np

from modperf.audit.check import describe_guard
from modperf.data.families import registry
from modperf.data.families.base import Ceiling, DuplicateSpread, LatencyFloor, Scaling, ShardedKey
from modperf.data.keyed_guards import scaling_ratios, sharded_chains
from modperf.data.loader import Loaded, Scope, load_many
from modperf.specs.roofline import gpu_spec


def ceiling_utilisation(keyed: Any, guard: Ceiling) -> float | None:
    """The highest utilisation of the guard's roofline component over the stored points."""
    gpu = gpu_spec(keyed.ref.system)
    if not gpu.from_file or keyed.family.roof is None:
        return None
    cols = keyed.bucket_columns
    point_bucket = np.repeat(np.arange(keyed.n_buckets), np.diff(keyed.offsets))
    columns: dict[str, Any] = dict(keyed.axes)
    for name in keyed.key_names:
        values, codes = cols.values[name], cols.codes[name][point_bucket]
        columns[name] = SimpleNamespace(codes=codes, values=values) if values and isinstance(values[0], str) \
            else np.asarray(values, dtype=np.int64)[codes]
    component = np.broadcast_to(getattr(keyed.family.roof(keyed.ref.table, columns, gpu), guard.component),
                                keyed.latency.shape)
    usable = keyed.latency > 0
    if guard.where is not None:
        plain = {k: (np.asarray(v.values, dtype=object)[v.codes] if isinstance(v, SimpleNamespace) else v)
                 for k, v in columns.items()}
        usable &= np.asarray(guard.where(plain), dtype=bool)
    if not usable.any():
        return None
    return float((component[usable] / (keyed.latency[usable] * 1e-3)).max())


def measure(loaded: Loaded) -> list[tuple[str, str, float | None, int | None]]:
    """(guard label, bound, statistic, pairs or keys) per guard of one loaded table."""
    keyed = loaded.keyed
    if keyed is None:
        return []
    out = []
    for guard in keyed.spec.guards:
        if isinstance(guard, Scaling):
            ratios = scaling_ratios(keyed, guard)
            usable = ratios is not None and ratios.size >= guard.min_pairs
            out.append((f"Scaling: {guard.name}", f"[{guard.low}, {guard.high}]",
                        float(np.median(ratios)) if usable and ratios is not None else None,
                        int(ratios.size) if ratios is not None else 0))
        elif isinstance(guard, DuplicateSpread) and guard.within is None:
            spread = keyed.duplicate_spread
            measured = spread[np.isfinite(spread)] if spread is not None else np.zeros(0)
            out.append(("DuplicateSpread", f"<= {guard.limit}", float(np.median(measured)) if measured.size else None,
                        int(measured.size)))
        elif isinstance(guard, Ceiling):
            out.append((f"Ceiling ({guard.component})", f"<= {guard.limit}", ceiling_utilisation(keyed, guard), None))
        elif isinstance(guard, ShardedKey):
            chains = sharded_chains(keyed, guard)
            if chains is not None:
                by_value, by_product, _ = chains
                # statistic: groups flagged (product chains beyond value chains); count: groups whose
                # column is measured at two or more sizes of `by` (what the guard has to go on)
                out.append((f"ShardedKey: {guard.column} / {guard.by} flagged", "0",
                            float((by_product > by_value).sum()), int((by_value > 0).sum())))
        elif isinstance(guard, LatencyFloor):
            positive = keyed.latency[keyed.latency > 0]
            out.append(("LatencyFloor", f">= {guard.ms} ms", float(positive.min()) if positive.size else None, None))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default=None)
    args = ap.parse_args()
    families = [f for f in registry().values() if any(s.guards for s in f.tables)
                and (args.family is None or f.name == args.family)]
    print(f"{'table':<24} {'guard':<58} {'bound':<14} {'files':>5} {'vacuous':>7} {'min':>8} {'median':>8} "
          f"{'max':>8} {'pairs/keys':>10}")
    for fam in families:
        selection = Scope(family=fam.name).select()
        per_file = load_many(selection, measure)
        stats: dict[tuple[str, str, str], list[tuple[float | None, int | None]]] = defaultdict(list)
        for ref in selection.refs:
            for label, bound, value, count in per_file[ref.path]:
                stats[(ref.table, label, bound)].append((value, count))
        for (table, label, bound), values in stats.items():
            measured = [v for v, _ in values if v is not None]
            counts = [c for _, c in values if c is not None]
            line = (f"{table:<24} {label[:58]:<58} {bound:<14} {len(values):>5} {len(values) - len(measured):>7} ")
            if measured:
                line += (f"{min(measured):>8.3g} {statistics.median(measured):>8.3g} {max(measured):>8.3g} "
                         f"{sum(counts) if counts else '-':>10}")
            print(line)
    print("vacuous: files where the guard has nothing to compare (one EP size, no duplicates, no system spec). "
          "Guards: " + ", ".join(sorted({describe_guard(g)["guard"] for f in families for s in f.tables
                                          for g in s.guards})))


if __name__ == "__main__":
    main()
