"""Rows -> buckets. A bucket is one slice of a table with every non-interpolated key fixed:
the categorical keys (op_name, kernel_source, dtypes...), the discrete keys (kv heads,
head_dim, window, compress_ratio...), the native head count where the family keys it, and the
local head count. Inside a bucket the points are sorted by the family's interpolation axes.

Duplicate rule (documented in docs/head-axis-keying.md): rows that share a full key (bucket
key + every axis value) inside one bucket -- alias measurements or re-measurements -- become
one point whose latency is the *lower median* of the duplicates (the middle value; for an even
count the lower of the two middle values). The rule is deterministic (independent of row
order), robust to one outlier among three or more, and always returns a latency that was
actually measured, bit for bit.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .catalog import TableRef
from .families.base import HEADS, Family, TableSpec, Tier

if TYPE_CHECKING:  # keying imports validation's column helpers on use: a cached table needs neither
    from .validate import ValidatedTable

NATIVE = "native"


@dataclass
class Agreement:
    """How closely rows of different natives agree at the same local key (local-only tier):
    relative spread (max/min - 1) per shared key."""

    natives: tuple[int, ...]
    shared_keys: int
    median: float | None
    p95: float | None
    max: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"natives": list(self.natives), "shared_keys": self.shared_keys, "median_rel_diff": self.median,
                "p95_rel_diff": self.p95, "max_rel_diff": self.max}


@dataclass
class BucketColumns:
    """Per key column, each bucket's value as a code, and the values the codes stand for
    (integer columns: sorted ascending)."""

    codes: dict[str, np.ndarray]
    values: dict[str, list[Any]]

    def decoded(self, name: str) -> np.ndarray:
        return np.asarray(self.values[name], dtype=object)[self.codes[name]]


@dataclass
class KeyedTable:
    """A validated table keyed by the head-axis convention."""

    ref: TableRef
    family: Family
    spec: TableSpec
    key_names: tuple[str, ...]  # bucket key columns, in order
    bucket_keys: list[tuple[Any, ...]]  # one tuple per bucket
    offsets: np.ndarray  # bucket b holds points offsets[b]:offsets[b+1]
    axes: dict[str, np.ndarray]  # per point, sorted within each bucket by spec.axes (narrowest int type)
    latency: np.ndarray  # per point (after the duplicate rule)
    sources: np.ndarray  # raw rows merged into each point (narrowest unsigned type)
    bucket_models: list[tuple[str, ...]]  # provenance: model names that measured each bucket
    bucket_native: np.ndarray  # per bucket, -1 where the table records no native
    bucket_local: np.ndarray  # per bucket
    model_native: dict[str, int]  # model -> native (from its config)
    model_geometry: dict[str, tuple[tuple[str, Any], ...]]
    rows_read: int  # rows keyed: one per phase where the family unpivots stored rows
    duplicates_merged: int  # rows removed by the duplicate rule
    alias_duplicate_points: int  # points measured under more than one model name
    agreement: Agreement | None = None
    missing_optional: tuple[str, ...] = ()
    #: Every native head count the rows stand for (from configs, or num_heads * tp_size in
    #: local-only tables that record tp), whether or not the buckets key it.
    natives_seen: tuple[int, ...] = ()
    #: Per point, the relative spread (max / min - 1) of the duplicate rows merged into it; NaN
    #: for a point measured once. None when the table has no duplicates.
    duplicate_spread: np.ndarray | None = None
    #: Distinct values of the table's ``version`` column (provenance: what the rows say ran).
    recorded_versions: tuple[str, ...] = ()
    #: Rows in the file as stored.
    rows_stored: int = -1
    #: The bucket keys column by column, as codes (for vectorised work over buckets).
    bucket_columns: BucketColumns | None = None
    #: Where the persisted cache keeps this table's grids: (cache folder, a digest of the
    #: table's entry identity); None when the table did not come from (or go to) the cache.
    cache_home: tuple[str, str] | None = field(default=None, repr=False, compare=False)
    _index: dict[tuple[Any, ...], int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._index = {k: i for i, k in enumerate(self.bucket_keys)}

    @property
    def n_buckets(self) -> int:
        return len(self.bucket_keys)

    @property
    def n_points(self) -> int:
        return int(self.latency.size)

    @property
    def natives(self) -> list[int]:
        return sorted(self.natives_seen)

    @property
    def models(self) -> list[str]:
        return sorted({m for ms in self.bucket_models for m in ms})

    def seen_as(self, ref: TableRef) -> KeyedTable:
        """The same loaded data seen through another slot (a reuse declaration): the arrays are
        shared, only the provenance changes."""
        view = copy.copy(self)
        view.ref = ref
        return view

    def bucket_id(self, key: tuple[Any, ...]) -> int | None:
        return self._index.get(key)

    def bucket(self, b: int) -> dict[str, Any]:
        """One bucket as plain data: its key, natives and models, and its points."""
        lo, hi = int(self.offsets[b]), int(self.offsets[b + 1])
        return {
            "key": dict(zip(self.key_names, self.bucket_keys[b])),
            "native": int(self.bucket_native[b]) if self.bucket_native[b] > 0 else None,
            "local": int(self.bucket_local[b]),
            "models": list(self.bucket_models[b]),
            "axes": {a: self.axes[a][lo:hi] for a in self.axes},
            "latency": self.latency[lo:hi],
        }


def build_buckets(vt: ValidatedTable) -> KeyedTable:
    from .codes import combine, factorize, unique_codes

    family, spec, n = vt.family, vt.spec, vt.n_rows
    cat_names = vt.present(spec.categorical)
    disc_names = vt.present(spec.discrete)
    keys_native = family.tier is Tier.NATIVE_LOCAL
    key_names: tuple[str, ...] = (*cat_names, *disc_names, *((NATIVE,) if keys_native else ()), *spec.heads)

    # per key column: codes, cardinality and decoder. (Memory: a 20M-row table is 160 MB per
    # int64 column, so codes stay in the narrowest type that holds them and every working array
    # is dropped as soon as it is used; bench/bigtable.py measures the peak.)
    codes: list[np.ndarray] = []
    cards: list[int] = []
    decoders: list[Any] = []
    for name in cat_names:
        c = vt.categorical[name]
        codes.append(c.codes)
        cards.append(len(c.values))
        decoders.append(c.values)
    int_cols = [*disc_names, *((NATIVE,) if keys_native else ()), *spec.heads]
    for name in int_cols:
        col = vt.native if name == NATIVE else vt.integers[name]
        assert col is not None
        uniq, inv = factorize(col)
        codes.append(_narrow(inv, uniq.size))
        del inv
        cards.append(int(uniq.size))
        decoders.append([int(u) for u in uniq])
    bucket_code = combine(codes, cards, n) if codes else np.zeros(n, dtype=np.int64)

    latency = vt.latency
    # sort: bucket, then axes in order, then latency (so duplicates sit ascending). The full key
    # is one mixed-radix integer, so two stable argsorts replace a many-key lexsort.
    axis_cards = [int(bucket_code.max()) + 1 if n else 1]
    axis_codes = []
    for axis in spec.axes:
        uniq, inv = factorize(vt.integers[axis])
        axis_codes.append(_narrow(inv, uniq.size))
        del inv
        axis_cards.append(int(uniq.size))
    full_code = combine([bucket_code, *axis_codes], axis_cards, n)
    del axis_codes
    order = _key_order(full_code, axis_cards, n, latency)
    del full_code
    b_sorted = bucket_code[order]
    del bucket_code
    # axis values in the narrowest signed type that holds them (a database of every table holds
    # ~12M points: int64 axes were half its memory); consumers widen before arithmetic
    ax_sorted = [narrowest_int(vt.integers[axis])[order] for axis in spec.axes]
    lat_sorted = latency[order]

    new_point = np.ones(n, dtype=bool)
    if n > 1:
        same = b_sorted[1:] == b_sorted[:-1]
        for col in ax_sorted:
            same &= col[1:] == col[:-1]
        new_point[1:] = ~same
        del same
    starts = np.flatnonzero(new_point)
    sizes = np.diff(np.append(starts, n))
    if starts.size == n:  # every row its own point (no duplicates): the sorted arrays are the points
        point_bucket = b_sorted
        point_latency = lat_sorted
        point_axes = dict(zip(spec.axes, ax_sorted))
    else:
        pick = starts + (sizes - 1) // 2  # lower median: latencies are ascending inside a group
        point_bucket = b_sorted[starts]
        point_latency = lat_sorted[pick]
        del pick
        point_axes = {name: a[starts] for name, a in zip(spec.axes, ax_sorted)}
    del b_sorted, ax_sorted
    spread = None
    if (sizes > 1).any():
        lo, hi = lat_sorted[starts], lat_sorted[starts + sizes - 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            spread = np.where((sizes > 1) & (lo > 0), hi / lo - 1.0, np.nan)
        del lo, hi

    # alias duplicates: points measured under more than one model name
    alias_points = 0
    point_of_row = np.cumsum(new_point) - 1
    if vt.model is not None and (sizes > 1).any():
        m_sorted = vt.model.codes[order].astype(np.int64)
        pairs = unique_codes(point_of_row * (len(vt.model.values) + 1) + m_sorted)
        names_per_point = np.bincount(pairs // (len(vt.model.values) + 1), minlength=starts.size)
        alias_points = int((names_per_point > 1).sum())

    agreement = None
    if family.tier is Tier.LOCAL and vt.native is not None:
        agreement = _agreement(point_of_row, vt.native[order], lat_sorted, starts.size)

    # buckets
    bucket_starts = (np.flatnonzero(np.r_[True, point_bucket[1:] != point_bucket[:-1]]) if starts.size
                     else np.array([], dtype=np.int64))
    offsets = np.append(bucket_starts, starts.size).astype(np.int64)
    first_rows = order[starts[bucket_starts]] if starts.size else np.array([], dtype=np.int64)
    bucket_keys: list[tuple[Any, ...]] = []
    decoded_cols: list[list[Any]] = []
    column_codes: dict[str, np.ndarray] = {}
    for name, code_col, dec in zip(key_names, codes, decoders):
        bucket_code_col = code_col[first_rows].astype(np.int64)
        column_codes[name] = bucket_code_col
        decoded_cols.append(np.asarray(dec, dtype=object)[bucket_code_col].tolist() if len(dec) else [])
    bucket_keys = list(zip(*decoded_cols)) if decoded_cols else [()] * len(first_rows)

    if keys_native or family.tier is Tier.NATIVE:
        bucket_native = (vt.native if vt.native is not None else np.full(n, -1))[first_rows]
    else:
        bucket_native = np.full(len(first_rows), -1, dtype=np.int64)
    bucket_local = vt.integers[HEADS][first_rows] if spec.head_axis else np.full(len(first_rows), -1)

    bucket_models: list[tuple[str, ...]]
    if vt.model is not None:
        row_bucket = np.repeat(np.arange(len(first_rows)), np.diff(offsets))[point_of_row]
        row_bucket *= len(vt.model.values) + 1  # (in place: a 20M-row table has no room for temporaries)
        row_bucket += vt.model.codes[order]
        pairs = unique_codes(row_bucket)
        del row_bucket
        per_bucket: list[list[str]] = [[] for _ in range(len(first_rows))]
        for p in pairs:
            per_bucket[int(p // (len(vt.model.values) + 1))].append(
                vt.model.values[int(p % (len(vt.model.values) + 1))])
        bucket_models = [tuple(sorted(ms)) for ms in per_bucket]
    else:
        bucket_models = [()] * len(first_rows)

    return KeyedTable(
        ref=vt.ref, family=family, spec=spec, key_names=key_names, bucket_keys=bucket_keys,
        offsets=offsets, axes=point_axes, latency=point_latency, sources=_count_type(sizes),
        bucket_models=bucket_models, bucket_native=np.asarray(bucket_native, dtype=np.int64),
        bucket_local=np.asarray(bucket_local, dtype=np.int64),
        model_native={m: c.native_heads for m, c in vt.configs.items()},
        model_geometry=dict(vt.geometry), rows_read=n, duplicates_merged=int(n - starts.size),
        alias_duplicate_points=alias_points, agreement=agreement, missing_optional=vt.missing_optional,
        natives_seen=tuple(int(v) for v in unique_codes(vt.native[vt.native > 0])) if vt.native is not None else (),
        duplicate_spread=spread, recorded_versions=vt.recorded_versions, rows_stored=vt.stored_rows,
        bucket_columns=BucketColumns(column_codes, dict(zip(key_names, decoders))),
    )


def _key_order(full_code: np.ndarray, cards: list[int], n: int, latency: np.ndarray) -> np.ndarray:
    """The rows in ascending order of their full key, rows sharing a key by ascending latency
    (the lower-median rule reads them so). Where the key space is at most twice the rows and
    no key repeats, a table of slots over it sorts in one pass (the count of filled slots says
    whether a key repeats); else a stable argsort, and a lexsort where keys repeat."""
    total = 1
    for c in cards:
        total *= max(c, 1)
    if n > 1 and total <= 2 * n and total < 2**31:
        slot = np.full(total, -1, dtype=np.int32)
        slot[full_code] = np.arange(n, dtype=np.int32)
        filled = slot[slot >= 0]
        del slot
        if filled.size == n:  # every key once: the filled slots, in key order, are the rows
            return filled.astype(np.intp)
        return np.lexsort((latency, full_code))
    order = np.argsort(full_code, kind="stable")  # files are often written in key order
    code_sorted = full_code[order]
    duplicated = n > 1 and bool((code_sorted[1:] == code_sorted[:-1]).any())
    del code_sorted
    return np.lexsort((latency, full_code)) if duplicated else order


def narrowest_int(values: np.ndarray) -> np.ndarray:
    """Integers in the narrowest signed type that holds all of them (the same values; the array
    itself when it is already that narrow)."""
    if not values.size:
        return values.astype(np.int8)
    low, high = int(values.min()), int(values.max())
    for dtype in (np.int8, np.int16, np.int32):
        info = np.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return values.astype(dtype, copy=False)
    return values.astype(np.int64, copy=False)


def _count_type(counts: np.ndarray) -> np.ndarray:
    """Row counts (>= 1) in the narrowest unsigned type that holds the largest (exact: a point
    merging 256 rows gets uint16, 65,536 rows uint32)."""
    high = int(counts.max()) if counts.size else 0
    for dtype in (np.uint8, np.uint16, np.uint32):
        if high <= np.iinfo(dtype).max:
            return counts.astype(dtype)
    return counts.astype(np.uint64)


def _narrow(codes: np.ndarray, card: int) -> np.ndarray:
    """Codes below ``card`` in the narrowest signed type that holds them (the same values)."""
    for dtype in (np.int8, np.int16, np.int32):
        if card <= np.iinfo(dtype).max:
            return codes.astype(dtype)
    return codes


def _agreement(point_of_row: np.ndarray, native_sorted: np.ndarray, lat_sorted: np.ndarray,
               n_points: int) -> Agreement | None:
    """Per point (a full local key), the lower-median latency of each native that measured it;
    relative spread where two or more natives did."""
    natives = np.unique(native_sorted)
    if natives.size < 2:
        return Agreement(tuple(int(v) for v in natives), 0, None, None, None)
    pair = point_of_row * (int(natives.max()) + 1) + native_sorted
    order = np.lexsort((lat_sorted, pair))
    pair_s, lat_s = pair[order], lat_sorted[order]
    starts = np.flatnonzero(np.r_[True, pair_s[1:] != pair_s[:-1]])
    sizes = np.diff(np.append(starts, pair_s.size))
    lat_per_pair = lat_s[starts + (sizes - 1) // 2]
    point_of_pair = pair_s[starts] // (int(natives.max()) + 1)
    count = np.bincount(point_of_pair, minlength=n_points)
    lo = np.full(n_points, np.inf)
    hi = np.zeros(n_points)
    np.minimum.at(lo, point_of_pair, lat_per_pair)
    np.maximum.at(hi, point_of_pair, lat_per_pair)
    shared = count >= 2
    if not shared.any():
        return Agreement(tuple(int(v) for v in natives), 0, None, None, None)
    rel = hi[shared] / lo[shared] - 1.0
    return Agreement(tuple(int(v) for v in natives), int(shared.sum()), float(np.median(rel)),
                     float(np.percentile(rel, 95)), float(rel.max()))
