"""Declared guards about a table's stored points as a whole, run on the keyed table.

Three guards look at how points relate to each other rather than at single rows, and the keyed
table has exactly what they need already computed (one point per full key after the duplicate
rule, its bucket and axis values, the spread of the rows merged into it):

* :class:`~modperf.families.base.Scaling` -- the median latency ratio over pairs of points whose
  keys differ by one declared step (tp x 2, half -> int8 at twice the elements, ...);
* :class:`~modperf.families.base.DuplicateSpread` -- re-measurements of one key agree;
* :class:`~modperf.families.base.ShardedKey` -- the per-rank fingerprint of a global column.

Row-level guards run in :mod:`modperf.conventions` during validation.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import numpy as np

from . import errors as E
from .buckets import KeyedTable
from .codes import combine, factorize
from .families.base import DuplicateSpread, Scaling, ShardedKey

#: Duplicated keys below this count decide nothing about their spread.
MIN_DUPLICATE_KEYS = 8


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


def scaling_ratios(keyed: KeyedTable, guard: Scaling) -> np.ndarray | None:
    """Latency ratios (stepped point / base point) over every pair of stored points whose keys
    differ by the guard's step; None when the table does not key the step's columns."""
    names = keyed.key_names
    axes = keyed.spec.axes
    if not all(c in names or c in axes for c in guard.step):
        return None
    position = {n: i for i, n in enumerate(names)}
    # buckets: which are bases (the step's "from" values, at_least on bucket keys) and their target
    target_bucket = np.full(keyed.n_buckets, -1, dtype=np.int64)
    bucket_steps = {c: s for c, s in guard.step.items() if c in position}
    for b, key in enumerate(keyed.bucket_keys):
        if any(c in position and key[position[c]] < low for c, low in guard.at_least.items()):
            continue
        moved = list(key)
        ok = True
        for c, step in bucket_steps.items():
            v = key[position[c]]
            if isinstance(step, tuple):
                ok = v == step[0]
                moved[position[c]] = step[1]
            else:
                moved[position[c]] = v * step
            if not ok:
                break
        if ok:
            t = keyed.bucket_id(tuple(moved))
            target_bucket[b] = -1 if t is None else t
    point_bucket = _point_bucket(keyed)
    n = keyed.n_points
    base = (target_bucket[point_bucket] >= 0) & (keyed.latency > 0)
    for c, low in guard.at_least.items():
        if c in keyed.axes:
            base &= keyed.axes[c] >= low
    # points: (bucket, axis values) -> one code; the target's code in the same space
    own_codes: list[np.ndarray] = [point_bucket]
    target_codes: list[np.ndarray] = [np.maximum(target_bucket[point_bucket], 0)]
    cards = [keyed.n_buckets]
    for a in axes:
        v = keyed.axes[a]
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
    where = np.flatnonzero(base)
    if not where.size:
        return np.zeros(0)
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
    if measured.size < MIN_DUPLICATE_KEYS:
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


def _sharded_fingerprint(keyed: KeyedTable, guard: ShardedKey) -> E.ModperfError | None:
    """Inside a group of otherwise equal bucket keys, a model measured at several sizes of `by`
    repeats its value of the column there (global: E at ep 1, 2, 4...), while a per-rank table
    repeats the product column * by (E/ep * ep). Two models can share a product by coincidence
    (Llama-4 Maverick, 128 experts at ep 1, and Scout, 16 at ep 8), so a group is flagged only
    when repeated products explain more of its chains than repeated values do."""
    names = keyed.key_names
    if guard.column not in names or guard.by not in names:
        return None
    ci, bi = names.index(guard.column), names.index(guard.by)
    others_at = [i for i in range(len(names)) if i not in (ci, bi)]
    rest_of = itemgetter(*others_at) if len(others_at) > 1 else (
        (lambda key: (key[others_at[0]],)) if others_at else (lambda key: ()))
    by_value: dict[tuple[Any, ...], set[Any]] = {}
    by_product: dict[tuple[Any, ...], set[Any]] = {}
    for key in keyed.bucket_keys:
        rest, v, b = rest_of(key), key[ci], key[bi]
        by_value.setdefault((rest, v), set()).add(b)
        by_product.setdefault((rest, v * b), set()).add(b)
    excess_value: dict[tuple[Any, ...], int] = {}
    excess_product: dict[tuple[Any, ...], int] = {}
    for (rest, _), sizes in by_value.items():
        excess_value[rest] = excess_value.get(rest, 0) + len(sizes) - 1
    for (rest, _), sizes in by_product.items():
        excess_product[rest] = excess_product.get(rest, 0) + len(sizes) - 1
    flagged = [rest for rest, e in excess_product.items() if e > excess_value.get(rest, 0)]
    if not flagged:
        return None
    others = [n for i, n in enumerate(names) if i not in (ci, bi)]
    examples = []
    for rest in flagged[:3]:
        chain = sorted((key[bi], key[ci]) for key in keyed.bucket_keys if rest_of(key) == rest)
        examples.append({**dict(zip(others, rest)), f"{guard.by} -> {guard.column}": sorted(set(chain))[:8]})
    return E.ConventionError(
        f"{guard.column} looks per-rank: in {len(flagged)} key group(s), {guard.column} * {guard.by} repeats across "
        f"{guard.by} sizes more often than {guard.column} does (each rank's slice); the declared global "
        f"{guard.column} stays put as {guard.by} varies",
        file=keyed.ref.path, values={"groups": len(flagged), "examples": examples}, fix=guard.fix)
