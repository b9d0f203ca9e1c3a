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
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .catalog import TableRef
from .families.base import HEADS, Family, TableSpec, Tier

if TYPE_CHECKING:  # keying imports validation's column helpers on use: a cached table needs neither
    import pyarrow as pa

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
    #: The identity of the table file this table is the keyed form of (modperf.fast.cache_keys:
    #: path, size, mtime, footer digest), set with ``cache_home``: what a persisted query plan
    #: resolved from it depends on (modperf.fast.plans).
    cache_source: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    #: Bucket key -> bucket, made on the first lookup (a check never looks one up).
    _index: dict[tuple[Any, ...], int] | None = field(default=None, repr=False, compare=False)

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
        index = self._index
        if index is None or (not index and self.bucket_keys):
            index = self._index = {k: i for i, k in enumerate(self.bucket_keys)}
        return index.get(key)

    def point_latencies(self) -> dict[tuple[Any, ...], float]:
        """Every point's latency by its full key (bucket key, then axis values): for comparing
        two files that measure the same table point by point."""
        names = tuple(self.axes)
        out: dict[tuple[Any, ...], float] = {}
        for b, key in enumerate(self.bucket_keys):
            lo, hi = int(self.offsets[b]), int(self.offsets[b + 1])
            columns = [self.axes[a][lo:hi].tolist() for a in names]
            for i, latency in enumerate(self.latency[lo:hi].tolist()):
                out[(*key, *(c[i] for c in columns))] = latency
        return out

    def to_arrow(self) -> pa.Table:
        """The table's measured points, one row each, as modperf answers from them: the key
        columns (rank-local ``num_heads``, and ``native`` where the family keys it), the axes,
        ``latency_ms`` (after the duplicate rule), ``merged_rows`` (the stored rows folded into
        the point) and ``models`` (the model names that measured its bucket, comma-joined);
        ``native`` also where the buckets record one the key does not hold."""
        import pyarrow as pa

        index = np.repeat(np.arange(self.n_buckets), np.diff(self.offsets))
        take = pa.array(index)
        columns: dict[str, Any] = {}
        for j, name in enumerate(self.key_names):
            columns[name] = pa.array([k[j] for k in self.bucket_keys]).take(take)
        if NATIVE not in self.key_names and bool((self.bucket_native > 0).any()):
            columns[NATIVE] = pa.array([int(v) if v > 0 else None for v in self.bucket_native], pa.int64()).take(take)
        for name, values in self.axes.items():
            columns[name] = pa.array(values)
        columns["latency_ms"] = pa.array(self.latency)
        columns["merged_rows"] = pa.array(self.sources)
        columns["models"] = pa.array([", ".join(ms) or None for ms in self.bucket_models], pa.string()).take(take)
        return pa.table(columns)

    def to_frame(self, library: str = "pandas") -> Any:
        """:meth:`to_arrow` as a pandas (or ``library="polars"``) frame, where installed."""
        from .frames import to_frame

        return to_frame(self.to_arrow(), library)

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


def build_buckets(vt: ValidatedTable, *, consume: bool = False) -> KeyedTable:
    """Key a validated table (the module docstring). With ``consume`` keying takes the table's
    columns over (``vt`` is left without them) and drops each as soon as it has used it; in a
    table of ``_READ_BACK_ROWS`` rows or more the key and axis columns go once they are in the
    key code (the points' axes and the buckets' keys are read back from the sorted code),
    latency once the points have theirs. Only the audits (coverage, dedupe) read a validated
    table after keying: a check or a query need not keep it, and a 20M-row table keys in less
    memory so (bench/load_stages.py)."""
    from .codes import narrowest_signed

    family, spec, n = vt.family, vt.spec, vt.n_rows
    cat_names = vt.present(spec.categorical)
    disc_names = vt.present(spec.discrete)
    keys_native = family.tier is Tier.NATIVE_LOCAL
    key_names: tuple[str, ...] = (*cat_names, *disc_names, *((NATIVE,) if keys_native else ()), *spec.heads)
    int_names = [*disc_names, *((NATIVE,) if keys_native else ()), *spec.heads]
    cat_values = [vt.categorical[name].values for name in cat_names]
    # The full key (every key column, then every axis) as one integer per row whose order is the
    # key's order, sorted once: rows sharing it become one point, points sharing its key part
    # one bucket. (Memory: a 20M-row table is 160 MB per int64 array, so the code is sorted in
    # place and every working array is dropped as soon as it is used; bench/bigtable.py
    # measures the peak.)
    digits = [_Digit.of_codes(vt.categorical[name].codes, len(values)) for name, values in zip(cat_names, cat_values)]
    for name in int_names:
        col = vt.native if name == NATIVE else vt.integers[name]
        assert col is not None
        digits.append(_Digit.of_ints(col))
    n_keys = len(digits)
    digits += [_Digit.of_ints(vt.integers[axis]) for axis in spec.axes]
    # axis values in the narrowest signed type that holds them (a database of every table holds
    # ~12M points: int64 axes were half its memory); consumers widen before arithmetic
    axis_types = [narrowest_signed(*d.bounds) for d in digits[n_keys:]]
    latency, model, natives_seen = vt.latency, vt.model, _natives_seen(vt.native)
    # the native by row: where it is no key but the buckets record it, or natives are compared
    native = vt.native if family.tier in (Tier.NATIVE, Tier.LOCAL) else None
    if consume:  # the digits and the locals above hold the only references now
        vt.categorical, vt.integers, vt.native, vt.model = {}, {}, None, None
        vt.latency = np.zeros(0, dtype=latency.dtype)
    row_bits = max((n - 1).bit_length(), 1)
    _fit(digits, _CODE_BITS - row_bits)
    radix = _radix_total(digits)
    # where the code is the digits' mixed-radix number and sorts tagged with its row, each digit
    # can be read back from the sorted code: a big table's columns are dropped once in the code
    # (a small table's are gathered: cheaper than the arithmetic, and they are small)
    readable = (consume and n >= _READ_BACK_ROWS and radix < 1 << _RADIX_BITS
                and (radix - 1).bit_length() + row_bits <= 63)
    code, total, by_division = _mixed_radix(digits, n, release=readable)
    # a code's key part is code // axis_space
    bucket_digits = _radix_total(digits[n_keys:]) if by_division else 0
    sorted_rows, tagged, same, bucket_change = _sort_rows(code, total, n, row_bits, bucket_digits)
    del code

    duplicated = bool(same.any())
    if duplicated:
        new_point = np.ones(n, dtype=bool)
        np.logical_not(same, out=new_point[1:])
        # where each point starts among the sorted rows, and its rows (as sources): narrow
        starts: np.ndarray[Any, np.dtype[np.signedinteger[Any]]] = np.flatnonzero(new_point).astype(
            np.int32 if n < 2**31 else np.int64)
        sizes = _count_type(np.diff(starts, append=np.int64(n)))
    n_points = int(starts.size) if duplicated else n
    bucket_starts: np.ndarray | None
    if not n_points:
        bucket_starts = np.zeros(0, dtype=np.int64)
    elif bucket_change is not None:  # the sorted rows where a bucket starts, as points
        rows = np.flatnonzero(bucket_change)
        rows += 1
        bucket_starts = np.r_[0, np.searchsorted(starts, rows) if duplicated else rows]
        del rows
    else:  # found below, from the key columns at the points
        bucket_starts = None
    del bucket_change

    key_at_first: list[np.ndarray] = []  # per key column, its value in each bucket's first row
    point_latency: np.ndarray | None = None
    if readable:
        assert tagged and bucket_starts is not None
        if not duplicated and not (family.tier is Tier.LOCAL and native is not None):
            # no ties to break, no natives to compare: latency in key order now, a chunk at a
            # time from the tagged codes, and dropped before the axes are read back
            point_latency = np.empty(n, dtype=latency.dtype)
            for lo in range(0, n, _CHUNK):
                point_latency[lo:lo + _CHUNK] = latency[sorted_rows[lo:lo + _CHUNK] & ((1 << row_bits) - 1)]
            latency = np.zeros(0, dtype=latency.dtype)  # read no more
        point_at = starts if duplicated else None  # sorted positions of the points (None: all)
        bucket_at = starts[bucket_starts] if duplicated else bucket_starts
        point_axes = dict(zip(spec.axes, _read_back(sorted_rows, point_at, row_bits, digits, n_keys, axis_types)))
        key_at_first = _read_back(sorted_rows, bucket_at, row_bits, digits, 0, [d.dtype for d in digits[:n_keys]],
                                  stop=n_keys)
    order = sorted_rows
    if tagged:
        order &= (1 << row_bits) - 1
    del sorted_rows
    _break_ties(order, same, latency)
    del same
    if not readable:  # the points' axes and the buckets' keys gathered from the columns
        point_rows = order[starts] if duplicated else order
        if bucket_starts is None:  # a bucket starts where any key column changes between neighbouring points
            change = np.zeros(n_points, dtype=bool)
            change[0] = True
            for d in digits[:n_keys]:
                values = d.values[point_rows]
                change[1:] |= values[1:] != values[:-1]
            bucket_starts = np.flatnonzero(change)
            del change
        point_axes = {axis: d.at(point_rows).astype(t, copy=False)
                      for axis, d, t in zip(spec.axes, digits[n_keys:], axis_types)}
        key_at_first = [d.at(point_rows[bucket_starts]) for d in digits[:n_keys]]
        del point_rows
    del digits
    assert bucket_starts is not None
    bucket_first_row = starts[bucket_starts] if duplicated else bucket_starts  # in sorted rows
    first_rows = order[bucket_first_row]

    spread = None
    if duplicated:  # a point's latency and spread from its rows, a chunk of points at a time
        point_latency = np.empty(n_points, dtype=latency.dtype)
        spread = np.empty(n_points, dtype=np.float64)
        for lo in range(0, n_points, _CHUNK):
            first, size = starts[lo:lo + _CHUNK], sizes[lo:lo + _CHUNK]
            # lower median: latencies are ascending inside a point
            point_latency[lo:lo + _CHUNK] = latency[order[first + (size - 1) // 2]]
            low, high = latency[order[first]], latency[order[first + size - 1]]
            with np.errstate(divide="ignore", invalid="ignore"):
                spread[lo:lo + _CHUNK] = np.where((size > 1) & (low > 0), high / low - 1.0, np.nan)
            del first, size, low, high
    elif point_latency is None:
        point_latency = latency[order]
    sources = sizes if duplicated else np.ones(n, dtype=np.uint8)

    agreement = None
    if family.tier is Tier.LOCAL and native is not None:
        agreement = _agreement(order, native, latency, starts if duplicated else None, n_points)
    if duplicated:
        del new_point
    del latency

    # alias duplicates: points measured under more than one model name (a point's rows are
    # consecutive: more than one name where its smallest and largest model code differ)
    alias_points = 0
    model_sorted = model.codes[order] if model is not None else None
    model_names = model.values if model is not None else []
    del model, order
    if model_sorted is not None and duplicated:
        alias_points = int(np.count_nonzero(np.minimum.reduceat(model_sorted, starts)
                                            != np.maximum.reduceat(model_sorted, starts)))
    if duplicated:
        del starts

    # buckets
    offsets = np.append(bucket_starts, n_points).astype(np.int64)
    nb = int(bucket_starts.size)
    decoders: list[Any] = []
    decoded_cols: list[list[Any]] = []
    column_codes: dict[str, np.ndarray] = {}
    for i, (name, at_first) in enumerate(zip(key_names, key_at_first)):
        if i < len(cat_names):
            dec: list[Any] = cat_values[i]
            bucket_code_col = at_first.astype(np.int64)
        else:  # every value of a key column is some bucket's: the buckets' values are the column's
            values = np.sort(at_first)
            uniq = values[np.r_[True, values[1:] != values[:-1]]] if values.size else values
            bucket_code_col = np.searchsorted(uniq, at_first).astype(np.int64, copy=False)
            dec = uniq.tolist()
        decoders.append(dec)
        column_codes[name] = bucket_code_col
        decoded_cols.append(np.asarray(dec, dtype=object)[bucket_code_col].tolist() if len(dec) else [])
    bucket_keys: list[tuple[Any, ...]] = list(zip(*decoded_cols)) if decoded_cols else [()] * nb

    if keys_native:
        bucket_native = key_at_first[key_names.index(NATIVE)]
    elif family.tier is Tier.NATIVE and native is not None:
        bucket_native = native[first_rows]
    else:
        bucket_native = np.full(nb, -1, dtype=np.int64)
    del native
    bucket_local = key_at_first[key_names.index(HEADS)] if spec.head_axis else np.full(nb, -1)

    bucket_models: list[tuple[str, ...]]
    if model_sorted is not None and nb:
        bucket_models = _bucket_models(model_sorted, model_names, np.diff(np.append(bucket_first_row, n)))
    else:
        bucket_models = [()] * nb
    del model_sorted

    return KeyedTable(
        ref=vt.ref, family=family, spec=spec, key_names=key_names, bucket_keys=bucket_keys,
        offsets=offsets, axes=point_axes, latency=point_latency,
        sources=sources,
        bucket_models=bucket_models, bucket_native=np.asarray(bucket_native, dtype=np.int64),
        bucket_local=np.asarray(bucket_local, dtype=np.int64),
        model_native={m: c.native_heads for m, c in vt.configs.items()},
        model_geometry=dict(vt.geometry), rows_read=n, duplicates_merged=int(n - n_points),
        alias_duplicate_points=alias_points, agreement=agreement, missing_optional=vt.missing_optional,
        natives_seen=natives_seen,
        duplicate_spread=spread, recorded_versions=vt.recorded_versions, rows_stored=vt.stored_rows,
        bucket_columns=BucketColumns(column_codes, dict(zip(key_names, decoders))),
    )


def _natives_seen(native: np.ndarray | None) -> tuple[int, ...]:
    """The distinct native head counts recorded (positive: -1 marks a row without one)."""
    from .codes import unique_codes

    if native is None:
        return ()
    positive = native if not native.size or native.min() > 0 else native[native > 0]
    return tuple(int(v) for v in unique_codes(positive))


def _bucket_models(model_sorted: np.ndarray, names: list[str], bucket_rows: np.ndarray) -> list[tuple[str, ...]]:
    """Per bucket, the sorted names of the models that measured it: ``model_sorted`` is each
    sorted row's model code, ``bucket_rows`` each bucket's count of (consecutive) rows."""
    from .codes import unique_codes

    by_name = sorted(range(len(names)), key=names.__getitem__)  # code -> its place in name order
    radix = len(names) + 1
    dtype = np.dtype(np.int32 if bucket_rows.size * radix < 2**31 else np.int64)  # a pair per row: narrow
    rank = np.empty(max(len(names), 1), dtype=dtype)
    rank[by_name] = np.arange(len(names), dtype=dtype)
    pair: np.ndarray = np.repeat(np.arange(bucket_rows.size, dtype=dtype) * radix, bucket_rows)  # NEP 50: narrow
    pair += rank[model_sorted]
    pairs = unique_codes(pair, bucket_rows.size * radix)
    del pair
    ordered = [names[i] for i in by_name]
    named = [ordered[r] for r in (pairs % radix).tolist()]
    if len(named) == bucket_rows.size:  # one model a bucket
        return [(m,) for m in named]
    bounds = np.searchsorted(pairs, np.arange(bucket_rows.size + 1, dtype=np.int64) * radix).tolist()
    return [tuple(named[a:b]) for a, b in itertools.pairwise(bounds)]


#: Keys are coded into one int64 with the row number beside them where they fit in this many bits.
_CODE_BITS = 63
#: A mixed-radix key code is one int64 where its digits span fewer values than 2 ** this.
_RADIX_BITS = 62


@dataclass
class _Digit:
    """One key column as a digit of the full key: its values, the smallest (subtracted), the
    count of values the digit spans, and whether those are ranks (codes, or a column
    factorized: card distinct values) rather than integers spanning max - min + 1."""

    values: np.ndarray
    low: int
    card: int
    ranked: bool
    #: The column's smallest and largest value (integer columns).
    bounds: tuple[int, int] = (0, 0)
    #: A factorized column's values, in rank order (what each rank stands for).
    levels: np.ndarray | None = None

    @classmethod
    def of_codes(cls, codes: np.ndarray, card: int) -> _Digit:
        return cls(codes, 0, max(card, 1), True)

    @classmethod
    def of_ints(cls, values: np.ndarray) -> _Digit:
        if not values.size:
            return cls(values, 0, 1, True)
        low, high = int(values.min()), int(values.max())
        if values.dtype == np.uint64:  # int64 + uint64 is float64 in numpy: the same values as int64, or ranks
            if high >= 2**63:
                return cls(values, low, high - low + 1, False, (low, high)).factorized()
            values = values.view(np.int64)
        return cls(values, low, high - low + 1, False, (low, high))

    def factorized(self) -> _Digit:
        """The digit as the rank of each value among the column's (narrow ranks through a
        presence table over a short span, whose bounds are known; else a hash)."""
        from .codes import DENSE_SPAN, dense_levels, factorize

        low, high = self.bounds
        span = high - low + 1
        if not self.ranked and span <= max(self.values.size, DENSE_SPAN) and span < 2**31:
            levels, rank = dense_levels(self.values, low, span)
        else:
            levels, rank = factorize(self.values)
        return _Digit(rank, 0, max(int(levels.size), 1), True, self.bounds, levels)

    @property
    def dtype(self) -> np.dtype:
        """The type the column's values are read back in."""
        return self.levels.dtype if self.levels is not None else np.dtype(np.int64)

    def at(self, rows: np.ndarray) -> np.ndarray:
        """The column's values at these rows (a code, for a categorical column)."""
        values = self.values[rows]
        return self.levels[values] if self.levels is not None else values

    def value_of(self, digit: np.ndarray) -> np.ndarray:
        """The column's values whose digits (value - low, or rank) these are."""
        if self.levels is not None:
            return self.levels[digit]
        if self.low:
            digit += self.low
        return digit


def _radix_total(digits: list[_Digit]) -> int:
    total = 1
    for d in digits:
        total *= d.card
    return total


def _fit(digits: list[_Digit], bits: int) -> None:
    """Where the digits span more than ``bits`` bits together, replace the widest integer
    digits by their ranks (a factorization keeps their order) until they fit or none is left.
    Most key columns span few values (head counts, tp, batch sizes): they go as they are."""
    while _radix_total(digits) > 1 << max(bits, 0):
        wide = [i for i, d in enumerate(digits) if not d.ranked]
        if not wide:
            return
        i = max(wide, key=lambda k: digits[k].card)
        digits[i] = digits[i].factorized()


def _mixed_radix(digits: list[_Digit], n: int, *, release: bool = False) -> tuple[np.ndarray, int, bool]:
    """One int64 code per row whose order is the digits' lexicographic order, the count of
    codes it can take, and whether it is the digits' mixed-radix number (where that fits in 62
    bits; else each row's rank among the distinct rows, by np.unique). With ``release`` (the
    caller reads the digits back from the code) each digit's values are dropped once in it."""
    total = _radix_total(digits)
    used = [d for d in digits if d.card > 1]  # a digit of one value adds nothing
    if total < 1 << _RADIX_BITS:
        if release:
            for d in digits:
                if d.card <= 1:
                    d.values = _NONE
        code = used[0].values.astype(np.int64) if used else np.zeros(n, dtype=np.int64)
        offset = used[0].low if used else 0
        if release and used:
            used[0].values = _NONE
        for d in used[1:]:
            code *= d.card  # in place: no temporary of n int64 per column
            code += d.values  # the digit's low is subtracted once, at the end (wrapping: exact)
            offset = offset * d.card + d.low
            if release:
                d.values = _NONE
        offset = (offset + (1 << 63)) % (1 << 64) - (1 << 63)
        if offset:
            code -= np.int64(offset)
        return code, total, True
    uniq, inverse = np.unique(np.stack([d.values.astype(np.int64) for d in used], axis=1), axis=0,
                              return_inverse=True)
    return inverse.reshape(-1).astype(np.int64), max(int(uniq.shape[0]), 1), False


#: Tables of this many rows or more (keyed with ``consume``) read their points' axes and their
#: buckets' keys back from the sorted key code instead of keeping the columns to gather them.
_READ_BACK_ROWS = 1 << 20

#: What a released digit holds instead of its values.
_NONE = np.zeros(0, dtype=np.int64)

#: Rows are tagged with their number this many at a time (a bounded temporary).
_CHUNK = 1 << 20


def _sort_rows(code: np.ndarray, total: int, n: int, row_bits: int,
               bucket_digits: int) -> tuple[np.ndarray, bool, np.ndarray, np.ndarray | None]:
    """The rows in ascending order of their full key (ties: see :func:`_break_ties`), whether
    they come as the sorted codes tagged with their row (``code << row_bits | row``) or as row
    numbers; where a sorted code equals the one before it; and, given the count of codes that
    share a key part (``bucket_digits`` > 0), where the key part differs from the one before.
    ``code`` is consumed. Where the codes and the row numbers fit one int64 together, each code
    is tagged with its row and the tagged codes are sorted in place (a stable order without a
    stable sort); else a stable argsort. Neighbours are compared a chunk at a time (no sorted
    copy of the codes beside the order)."""
    if (total - 1).bit_length() + row_bits <= 63:
        tagged = code
        tagged <<= row_bits
        for lo in range(0, n, _CHUNK):
            tagged[lo:lo + _CHUNK] |= np.arange(lo, min(n, lo + _CHUNK), dtype=np.int64)
        tagged.sort()
        same, bucket_change = _neighbours(tagged, row_bits, bucket_digits)
        return tagged, True, same, bucket_change
    order = np.argsort(code, kind="stable")
    same, bucket_change = _neighbours(code[order], 0, bucket_digits)
    return order, False, same, bucket_change


def _break_ties(order: np.ndarray, same: np.ndarray, latency: np.ndarray) -> None:
    """Rows of a repeated key (``same``: where a sorted key equals the one before) in ascending
    latency, then row (the lower-median rule reads them so; a stable sort keeps the row order):
    ``order`` is reordered in place, about ``_CHUNK`` sorted rows at a time (cut where a key
    starts: a 20M-row table whose every key repeats held 40 B per row of temporaries at once)."""
    n = order.size
    lo = 0
    while lo < n:
        hi = min(n, lo + _CHUNK)
        while hi < n and same[hi - 1]:  # the key at hi continues: cut after it
            more = np.flatnonzero(~same[hi - 1:hi - 1 + _CHUNK])
            hi = hi + int(more[0]) if more.size else min(n, hi + _CHUNK)
        _break_ties_in(order[lo:hi], same[lo:hi - 1], latency)
        lo = hi


def _break_ties_in(order: np.ndarray, same: np.ndarray, latency: np.ndarray) -> None:
    """:func:`_break_ties` on sorted rows that no repeated key crosses the ends of."""
    if not same.any():
        return
    inside = np.zeros(order.size, dtype=bool)
    inside[1:] |= same
    inside[:-1] |= same
    at = np.flatnonzero(inside)
    del inside
    group = np.cumsum(np.r_[True, ~same])[at]
    rows = order[at]
    order[at] = rows[np.lexsort((latency[rows], group))]


def _read_back(tagged: np.ndarray, positions: np.ndarray | None, row_bits: int, digits: list[_Digit], first: int,
               types: list[np.dtype], stop: int | None = None) -> list[np.ndarray]:
    """The columns of ``digits[first:stop]`` (their values, in ``types``) at these positions of
    the sorted tagged codes (None: every position), read back from the codes: a code is its
    digits' mixed-radix number (each digit the value less the column's smallest, or its rank),
    so the last digit is code % card, the one before (code // card) % its card, and so on. A
    chunk of positions at a time."""
    stop = len(digits) if stop is None else stop
    size = tagged.size if positions is None else positions.size
    out = [np.empty(size, dtype=t) for t in types]
    for lo in range(0, size, _CHUNK):
        hi = min(size, lo + _CHUNK)
        part = tagged[lo:hi] if positions is None else tagged[positions[lo:hi]]
        part = part >> row_bits
        for i in range(len(digits) - 1, first - 1, -1):
            d = digits[i]
            if d.card > 1:  # (floor division by a scalar is fast in numpy; % and divmod are not)
                quotient = part // d.card
                digit = quotient * d.card
                np.subtract(part, digit, out=digit)
                part = quotient
            else:
                digit = np.zeros(hi - lo, dtype=np.int64)
            if i < stop:
                out[i - first][lo:hi] = d.value_of(digit)
    return out


def _neighbours(sorted_codes: np.ndarray, shift: int, bucket_digits: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Where each sorted code (``sorted_codes >> shift``) equals the one before it, and where
    its key part (code // bucket_digits, if > 0) differs from the one before it."""
    size = max(sorted_codes.size - 1, 0)
    same = np.empty(size, dtype=bool)
    change = np.empty(size, dtype=bool) if bucket_digits else None
    for lo in range(0, size, _CHUNK):
        hi = min(size, lo + _CHUNK)
        part = sorted_codes[lo:hi + 1] >> shift if shift else sorted_codes[lo:hi + 1].copy()
        np.equal(part[1:], part[:-1], out=same[lo:hi])
        if change is not None:
            if bucket_digits > 1:
                part //= bucket_digits
            np.not_equal(part[1:], part[:-1], out=change[lo:hi])
    return same, change


def _count_type(counts: np.ndarray) -> np.ndarray:
    """Row counts (>= 1) in the narrowest unsigned type that holds the largest (exact: a point
    merging 256 rows gets uint16, 65,536 rows uint32)."""
    high = int(counts.max()) if counts.size else 0
    for dtype in (np.uint8, np.uint16, np.uint32):
        if high <= np.iinfo(dtype).max:
            return counts.astype(dtype)
    return counts.astype(np.uint64)


def _agreement(order: np.ndarray, native: np.ndarray, latency: np.ndarray, starts: np.ndarray | None,
               n_points: int) -> Agreement | None:
    """Per point (a full local key), the lower-median latency of each native that measured it;
    relative spread where two or more natives did. ``order``: the rows in key order, ties by
    latency; ``starts``: where each point starts among them (None: a point per row). A chunk
    of about ``_CHUNK`` rows at a time, cut where a point starts (points are independent)."""
    natives = np.unique(native)
    if natives.size < 2:
        return Agreement(tuple(int(v) for v in natives), 0, None, None, None)
    radix = int(natives.max()) + 1
    whole = int(natives.min()) < 0  # (pair codes would cross points: one chunk, as they always did)
    count = np.zeros(n_points, dtype=np.int64)
    lo = np.full(n_points, np.inf)
    hi = np.zeros(n_points)
    p0 = 0
    while p0 < n_points:
        r0 = int(starts[p0]) if starts is not None else p0
        if whole:
            p1 = n_points
        elif starts is not None:
            p1 = max(p0 + 1, int(np.searchsorted(starts, r0 + _CHUNK)))
        else:
            p1 = min(n_points, p0 + _CHUNK)
        r1 = (int(starts[p1]) if p1 < n_points else order.size) if starts is not None else p1
        rows = order[r0:r1]
        if starts is not None:  # each row's point, counted from p0
            point_of_row = np.repeat(np.arange(p1 - p0, dtype=np.int64),
                                     np.diff(starts[p0:p1], append=np.int64(r1)))
        else:
            point_of_row = np.arange(p1 - p0, dtype=np.int64)
        pair = point_of_row * radix + native[rows]
        del point_of_row
        lat_rows = latency[rows]
        by_pair = np.lexsort((lat_rows, pair))
        pair_s, lat_s = pair[by_pair], lat_rows[by_pair]
        del pair, lat_rows, by_pair
        first = np.flatnonzero(np.r_[True, pair_s[1:] != pair_s[:-1]])
        sizes = np.diff(np.append(first, pair_s.size))
        lat_per_pair = lat_s[first + (sizes - 1) // 2]
        point_of_pair = pair_s[first] // radix
        count[p0:p1] += np.bincount(point_of_pair, minlength=p1 - p0)
        point_of_pair += p0
        np.minimum.at(lo, point_of_pair, lat_per_pair)
        np.maximum.at(hi, point_of_pair, lat_per_pair)
        p0 = p1
    shared = count >= 2
    if not shared.any():
        return Agreement(tuple(int(v) for v in natives), 0, None, None, None)
    rel = hi[shared] / lo[shared] - 1.0
    return Agreement(tuple(int(v) for v in natives), int(shared.sum()), float(np.median(rel)),
                     float(np.percentile(rel, 95)), float(rel.max()))
