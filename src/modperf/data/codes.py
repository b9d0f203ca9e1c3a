"""Integer coding helpers shared by the loaders: factorize key columns, combine several codes
into one, list distinct codes. All are O(n) where numpy's sort-based unique would be O(n log n);
the loaders call them on every row of every table."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Code spaces below this bound use a presence table instead of a sort.
_DENSE_LIMIT = 1 << 24

#: (type, smallest, largest) of the integer types below int64, narrowest first: signed only,
#: and signed or unsigned (bounds taken once, not an np.iinfo per call).
_SIGNED = tuple((np.dtype(t), int(np.iinfo(t).min), int(np.iinfo(t).max)) for t in (np.int8, np.int16, np.int32))
_ANY_SIGN = tuple((np.dtype(t), int(np.iinfo(t).min), int(np.iinfo(t).max))
                  for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32))


def narrowest_signed(low: int, high: int) -> np.dtype:
    """The narrowest signed integer type holding every value in [low, high]."""
    for dtype, smallest, largest in _SIGNED:
        if smallest <= low and high <= largest:
            return dtype
    return np.dtype(np.int64)


def narrowest_int(low: int, high: int) -> np.dtype:
    """The narrowest integer type, signed or unsigned, holding every value in [low, high] (a
    head count of 128 fits uint8, a batch size of 60,000 uint16)."""
    for dtype, smallest, largest in _ANY_SIGN:
        if smallest <= low and high <= largest:
            return dtype
    return np.dtype(np.int64)


def unique_codes(codes: np.ndarray, bound: int | None = None) -> np.ndarray:
    """Sorted distinct values of a non-negative integer array (typically combined codes)."""
    if not codes.size:
        return codes
    top = int(codes.max()) + 1 if bound is None else bound
    if top <= _DENSE_LIMIT:
        present = np.zeros(top, dtype=bool)
        present[codes] = True
        return np.flatnonzero(present)
    return np.unique(codes)


def to_numpy(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Arrow numbers -> numpy, zero-copy where possible.

    pyarrow's own ``to_numpy`` and ``pa.array`` probe for pandas on first use, which imports
    it (pandas arrives with the data wheel's dependencies) and costs a third of a second on
    every cold command; reading the data buffer directly does not.
    """
    if isinstance(array, pa.ChunkedArray):
        parts = [to_numpy(c) for c in array.chunks]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=_numpy_dtype(array.type))
    t = array.type
    if array.null_count or not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        return array.to_numpy(zero_copy_only=False)
    if pa.types.is_boolean(t):  # bit-packed
        bits = np.unpackbits(np.frombuffer(array.buffers()[1], dtype=np.uint8), bitorder="little")
        return bits[array.offset: array.offset + len(array)].astype(bool)
    dtype = _numpy_dtype(t)
    buffer = array.buffers()[1]
    if buffer is None or not len(array):
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(buffer, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _numpy_dtype(t: pa.DataType) -> np.dtype:
    kind = "f" if pa.types.is_floating(t) else "u" if pa.types.is_unsigned_integer(t) else "i"
    return np.dtype(f"{kind}{t.bit_width // 8}")


def from_numpy(values: np.ndarray) -> pa.Array:
    """numpy numbers -> Arrow, zero-copy (see :func:`to_numpy` for why not ``pa.array``)."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), values.size, [None, pa.py_buffer(values)])


def dense_ranks(values: np.ndarray, low: int, span: int) -> tuple[int, np.ndarray]:
    """(count of distinct values, each value's rank among them in ascending order) of integers
    lying in [low, low + span), span < 2**31, through a presence table over the span: no sort,
    no hash and no int64 temporary per row; the ranks in the narrowest signed type over the
    count."""
    levels, rank = dense_levels(values, low, span)
    return int(levels.size), rank


def dense_levels(values: np.ndarray, low: int, span: int) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct values ascending, in the values' type; each value's rank among them) of
    integers lying in [low, low + span), span < 2**31: :func:`dense_ranks` with the values the
    ranks stand for."""
    # values - low lies in [0, span): exact in that type (the subtraction wraps consistently)
    shifted = np.subtract(values, values.dtype.type(low), dtype=narrowest_signed(0, span), casting="unsafe")
    present = np.zeros(span, dtype=bool)
    present[shifted] = True
    rank = np.cumsum(present, dtype=np.int64)  # (one per value of the span, not per row)
    count = int(rank[-1])
    rank -= 1
    levels = np.flatnonzero(present).astype(values.dtype)  # offsets from low, wrapping back to
    levels += values.dtype.type(low)  # the values themselves
    return levels, rank.astype(narrowest_signed(0, count))[shifted]


#: Integer columns whose values span at most this many (or as many as they have rows) are
#: factorized through a presence table over the span instead of a hash table.
DENSE_SPAN = 1 << 14


def factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique values, code of each value), by hashing (O(n)) rather than sorting.

    Integers over a short span (head counts, tp, batch sizes, sequence lengths: nearly every key
    column) skip the hash: a presence table over [min, max] gives the sorted values and its
    running count each value's code, the same arrays the hash gives."""
    if not values.size:
        return values, values.astype(np.int64)
    if values.dtype.kind in "iu":
        low, high = int(values.min()), int(values.max())
        span = high - low + 1
        if span <= max(values.size, DENSE_SPAN) and span < 2**31:
            # values - low lies in [0, span): exact in int32 (the subtraction wraps consistently)
            shifted = np.subtract(values, values.dtype.type(low), dtype=np.int32, casting="unsafe")
            present = np.zeros(span, dtype=bool)
            present[shifted] = True
            rank = np.cumsum(present, dtype=np.int64)
            rank -= 1
            uniq = np.flatnonzero(present).astype(values.dtype)  # offsets from low, wrapping back to
            uniq += values.dtype.type(low)  # the values themselves
            return uniq, rank[shifted]
    encoded = pc.dictionary_encode(from_numpy(values))
    uniq = to_numpy(encoded.dictionary)
    perm = np.argsort(uniq, kind="stable")
    rank = np.empty(perm.size, dtype=np.int64)
    rank[perm] = np.arange(perm.size)
    return uniq[perm], rank[to_numpy(encoded.indices)]


def combine(codes: list[np.ndarray], cards: list[int], n: int) -> np.ndarray:
    """Mixed-radix combination of per-column codes into one int64 code per row."""
    total = 1
    for c in cards:
        total *= max(c, 1)
    if total < 2**62:
        combined = np.zeros(n, dtype=np.int64)
        for code, card in zip(codes, cards):
            combined *= max(card, 1)  # in place: no temporary of n int64 per column
            combined += code
        return combined
    # Too many combinations for one integer: fall back to row-wise unique.
    _, inverse = np.unique(np.stack([c.astype(np.int64) for c in codes], axis=1), axis=0, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64)
