"""Declared guards about a table's stored points as a whole, run on the keyed table.

Three guards look at how points relate to each other rather than at single rows, and the keyed
table has exactly what they need already computed (one point per full key after the duplicate
rule, its bucket and axis values, the spread of the rows merged into it):

* :class:`~modperf.data.families.base.Scaling` -- the median latency ratio over pairs of points whose
  keys differ by one declared step (tp x 2, half -> int8 at twice the elements, ...);
* :class:`~modperf.data.families.base.DuplicateSpread` -- re-measurements of one key agree;
* :class:`~modperf.data.families.base.ShardedKey` -- the per-rank fingerprint of a global column.

Row-level guards run in :mod:`modperf.data.conventions` during validation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import errors as E
from .buckets import KeyedTable
from .codes import combine, factorize, unique_codes
from .families.base import DuplicateSpread, Scaling, ShardedKey


def check_points(keyed: KeyedTable) -> list[E.ModperfError]:
    """Every point guard the table declares; the failures (empty when clean)."""
    out: list[E.ModperfError] = []
    for guard in keyed.spec.guards:
        if isinstance(guard, Scaling):
            failure = _scaling(keyed, guard)
        elif isinstance(guard, DuplicateSpread) and guard.within is None:
            failure = _duplicate_spread(keyed, guard)
        elif isinstance(guard, ShardedKey):
            failure = _sharded_fingerprint(keyed, guard)
        else:
            continue
        if failure is not None:
            out.append(failure)
    return out


def _point_bucket(keyed: KeyedTable) -> np.ndarray:
    return np.repeat(np.arange(keyed.n_buckets), np.diff(keyed.offsets))


def _bucket_targets(keyed: KeyedTable, guard: Scaling) -> np.ndarray | None:
    """Per bucket, the bucket its key moves to under the step's bucket-key columns (-1: none,
    or the bucket is not a base); None when the table does not key the step's columns."""
    names, cols = keyed.key_names, keyed.bucket_columns
    assert cols is not None
    nb = keyed.n_buckets
    base = np.ones(nb, dtype=bool)
    own_codes: list[np.ndarray] = []
    target_codes: list[np.ndarray] = []
    cards: list[int] = []
    for name in names:
        codes, values = cols.codes[name], cols.values[name]
        card = max(len(values), 1)
        step = guard.step.get(name)
        target = codes
        if isinstance(step, tuple):
            if step[0] not in values or step[1] not in values:
                return np.full(nb, -1, dtype=np.int64)  # the table does not measure both ends
            base &= codes == values.index(step[0])
            target = np.full(nb, values.index(step[1]), dtype=np.int64)
        elif step is not None:
            ints = np.asarray(values, dtype=np.int64)  # sorted ascending
            moved = ints[codes] * step
            target = np.minimum(np.searchsorted(ints, moved), card - 1)
            base &= ints[target] == moved
        if name in guard.at_least:
            base &= np.asarray(values, dtype=np.int64)[codes] >= guard.at_least[name]
        own_codes.append(codes)
        target_codes.append(target)
        cards.append(card)
    both = combine([np.concatenate([o, t]) for o, t in zip(own_codes, target_codes)], cards, 2 * nb)
    own, target = both[:nb], both[nb:]
    order = np.argsort(own, kind="stable")
    hit = np.minimum(np.searchsorted(own[order], target), max(nb - 1, 0))
    found = base & (own[order][hit] == target) if nb else base
    return np.where(found, order[hit], -1) if nb else np.zeros(0, dtype=np.int64)


def scaling_ratios(keyed: KeyedTable, guard: Scaling) -> np.ndarray | None:
    """Latency ratios (stepped point / base point) over every pair of stored points whose keys
    differ by the guard's step, in the base points' order; None when the table does not key
    the step's columns."""
    names = keyed.key_names
    axes = keyed.spec.axes
    if not all(c in names or c in axes for c in guard.step):
        return None
    target_bucket = _bucket_targets(keyed, guard)
    if target_bucket is None:
        return None
    point_bucket = _point_bucket(keyed)
    moved_bucket = target_bucket[point_bucket]
    base = (moved_bucket >= 0) & (keyed.latency > 0)
    for c, low in guard.at_least.items():
        if c in keyed.axes:
            base &= keyed.axes[c] >= low
    where = np.flatnonzero(base)
    del base
    if not where.size:
        return np.zeros(0)
    spans = _spans(keyed, axes)
    if spans is None:
        return _scaling_ratios_ranked(keyed, guard, point_bucket, target_bucket, where)
    # Points are stored in key order (bucket, then each axis ascending), so their codes in the
    # mixed radix of (bucket, each axis's value - its smallest) ascend: a step's partner is a
    # binary search away, with no sort. A stepped value outside an axis's range has none.
    own = point_bucket  # (consumed: the points' codes are built in it; the ranked way below makes it again)
    moved = moved_bucket[where]
    inside = np.ones(where.size, dtype=bool)
    for a, (low, span) in zip(axes, spans):
        values = keyed.axes[a]
        own *= span
        own += values
        own -= low
        stepped = values[where].astype(np.int64)  # stored narrow: the step's product must not wrap
        factor = guard.step.get(a)
        if isinstance(factor, int):
            stepped *= factor
            inside &= (stepped >= low) & (stepped < low + span)
        moved *= span
        moved += stepped
        moved -= low
    n = own.size
    if n > 1 and not bool((own[1:] > own[:-1]).all()):  # not in key order (never from build_buckets)
        return _scaling_ratios_ranked(keyed, guard, _point_bucket(keyed), target_bucket, where)
    where, moved = where[inside], moved[inside]
    hit = np.minimum(np.searchsorted(own, moved), n - 1)
    found = own[hit] == moved
    partner = hit[found]
    ok = keyed.latency[partner] > 0
    return keyed.latency[partner[ok]] / keyed.latency[where[found][ok]]


def _spans(keyed: KeyedTable, axes: tuple[str, ...]) -> list[tuple[int, int]] | None:
    """Per axis, its smallest value and the count of values from it to its largest; None where
    buckets x spans pass 62 bits."""
    total = max(keyed.n_buckets, 1)
    out = []
    for a in axes:
        values = keyed.axes[a]
        low, high = (int(values.min()), int(values.max())) if values.size else (0, 0)
        out.append((low, high - low + 1))
        total *= high - low + 1
    return out if total < 1 << 62 else None


def _scaling_ratios_ranked(keyed: KeyedTable, guard: Scaling, point_bucket: np.ndarray, target_bucket: np.ndarray,
                           where: np.ndarray) -> np.ndarray:
    """:func:`scaling_ratios` for any table: every axis value (and stepped value) ranked among
    both, the points' codes sorted."""
    axes = keyed.spec.axes
    n = keyed.n_points
    # points: (bucket, axis values) -> one code; the target's code in the same space
    own_codes: list[np.ndarray] = [point_bucket]
    target_codes: list[np.ndarray] = [np.maximum(target_bucket[point_bucket], 0)]
    cards = [keyed.n_buckets]
    for a in axes:
        v = keyed.axes[a].astype(np.int64)  # stored narrow: the step's product must not wrap
        factor = guard.step.get(a)
        shifted = v * factor if isinstance(factor, int) else v
        joint, inv = factorize(np.concatenate([v, shifted]))
        own_codes.append(inv[:n])
        target_codes.append(inv[n:])
        cards.append(int(joint.size))
    both = combine([np.concatenate([o, t]) for o, t in zip(own_codes, target_codes)], cards, 2 * n)
    own, target = both[:n], both[n:]
    order = np.argsort(own, kind="stable")
    sorted_own = own[order]
    hit = np.minimum(np.searchsorted(sorted_own, target[where]), n - 1)
    found = sorted_own[hit] == target[where]
    partner = order[hit[found]]
    ok = keyed.latency[partner] > 0
    return keyed.latency[partner[ok]] / keyed.latency[where[found][ok]]


def _scaling(keyed: KeyedTable, guard: Scaling) -> E.ModperfError | None:
    ratios = scaling_ratios(keyed, guard)
    if ratios is None or ratios.size < guard.min_pairs:
        return None
    median = float(np.median(ratios))
    if (guard.low is None or median >= guard.low) and (guard.high is None or median <= guard.high):
        return None
    bounds = f"[{guard.low if guard.low is not None else '-'}, {guard.high if guard.high is not None else '-'}]"
    return E.ConventionError(
        f"{guard.name}: the median latency ratio over {ratios.size} pairs of stored points is {median:.3g}, outside "
        f"{bounds}; the declared convention predicts {guard.expect}, and {guard.other}",
        file=keyed.ref.path,
        values={"step": {k: list(v) if isinstance(v, tuple) else f"x{v}" for k, v in guard.step.items()},
                "pairs": int(ratios.size), "median_ratio": round(median, 4),
                "p10": round(float(np.percentile(ratios, 10)), 4), "p90": round(float(np.percentile(ratios, 90)), 4),
                "expected": bounds},
        fix=guard.fix)


def _describe(keyed: KeyedTable, point: int, bucket_of: np.ndarray) -> dict[str, Any]:
    b = int(bucket_of[point])
    return {**dict(zip(keyed.key_names, keyed.bucket_keys[b])), **{a: int(v[point]) for a, v in keyed.axes.items()}}


def _duplicate_spread(keyed: KeyedTable, guard: DuplicateSpread) -> E.ModperfError | None:
    if keyed.duplicate_spread is None:
        return None
    spread = keyed.duplicate_spread
    measured = np.flatnonzero(np.isfinite(spread))
    if measured.size < guard.min_keys:
        return None
    median = float(np.median(spread[measured]))
    if median <= guard.limit:
        return None
    worst = measured[np.argsort(-spread[measured], kind="stable")[:3]]
    bucket_of = _point_bucket(keyed)
    return E.DuplicateSpreadError(
        f"rows sharing a full key disagree: the median spread (max / min - 1) over {measured.size} duplicated keys "
        f"is {median:.3g} (re-measurements agree within {guard.limit:g}); such rows stand for different work",
        file=keyed.ref.path,
        values={"duplicated_keys": int(measured.size), "median_spread": round(median, 4),
                "widest": [{**_describe(keyed, int(p), bucket_of), "rows": int(keyed.sources[p]),
                            "spread": round(float(spread[p]), 4)} for p in worst]},
        fix=guard.fix)


def sharded_chains(keyed: KeyedTable, guard: ShardedKey) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per group of otherwise equal bucket keys: the `by` sizes beyond the first at which a value
    of the column repeats (chains the global convention explains), the same for the product
    column * by (chains a per-rank table shows), and each bucket's group. None when the table
    does not key both columns."""
    names, cols = keyed.key_names, keyed.bucket_columns
    if guard.column not in names or guard.by not in names or cols is None or not keyed.n_buckets:
        return None
    nb = keyed.n_buckets
    others = [c for c in names if c not in (guard.column, guard.by)]
    rest = combine([cols.codes[c] for c in others], [max(len(cols.values[c]), 1) for c in others], nb) \
        if others else np.zeros(nb, dtype=np.int64)
    _, rest = factorize(rest)
    n_rest = int(rest.max()) + 1
    value = np.asarray(cols.values[guard.column], dtype=np.int64)[cols.codes[guard.column]]
    by_code = cols.codes[guard.by].astype(np.int64)
    by = np.asarray(cols.values[guard.by], dtype=np.int64)[by_code]
    n_by = max(len(cols.values[guard.by]), 1)

    def excess(key: np.ndarray) -> np.ndarray:
        _, k = factorize(key)
        pair = rest * (int(k.max()) + 1) + k
        pairs, sizes = np.unique(unique_codes(pair * n_by + by_code) // n_by, return_counts=True)
        return np.bincount(pairs // (int(k.max()) + 1), weights=sizes - 1, minlength=n_rest)

    return excess(value), excess(value * by), rest


def _sharded_fingerprint(keyed: KeyedTable, guard: ShardedKey) -> E.ModperfError | None:
    """Inside a group of otherwise equal bucket keys, a model measured at several sizes of `by`
    repeats its value of the column there (global: E at ep 1, 2, 4...), while a per-rank table
    repeats the product column * by (E/ep * ep). Two models can share a product by coincidence
    (Llama-4 Maverick, 128 experts at ep 1, and Scout, 16 at ep 8), so a group is flagged only
    when repeated products explain more of its chains than repeated values do."""
    chains = sharded_chains(keyed, guard)
    if chains is None:
        return None
    by_value, by_product, rest = chains
    flagged = np.flatnonzero(by_product > by_value)
    if not flagged.size:
        return None
    names, cols = keyed.key_names, keyed.bucket_columns
    assert cols is not None
    others = [c for c in names if c not in (guard.column, guard.by)]
    value = np.asarray(cols.values[guard.column], dtype=np.int64)[cols.codes[guard.column]]
    by = np.asarray(cols.values[guard.by], dtype=np.int64)[cols.codes[guard.by]]
    examples = []
    for g in flagged[:3]:
        members = np.flatnonzero(rest == g)
        first = keyed.bucket_keys[int(members[0])]
        chain = sorted({(int(by[m]), int(value[m])) for m in members})
        examples.append({**{c: first[names.index(c)] for c in others}, f"{guard.by} -> {guard.column}": chain[:8]})
    return E.ConventionError(
        f"{guard.column} looks per-rank: in {flagged.size} key group(s), {guard.column} * {guard.by} repeats across "
        f"{guard.by} sizes more often than {guard.column} does (each rank's slice); the declared global "
        f"{guard.column} stays put as {guard.by} varies",
        file=keyed.ref.path, values={"groups": int(flagged.size), "examples": examples}, fix=guard.fix)
