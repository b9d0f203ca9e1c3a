"""Integer coding helpers shared by the loaders: factorize key columns, combine several codes
into one, list distinct codes. All are O(n) where numpy's sort-based unique would be O(n log n);
the loaders call them on every row of every table."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Code spaces below this bound use a presence table instead of a sort.
_DENSE_LIMIT = 1 << 24


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


def factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique values, code of each value), by hashing (O(n)) rather than sorting."""
    if not values.size:
        return values, values.astype(np.int64)
    encoded = pc.dictionary_encode(pa.array(values))
    uniq = encoded.dictionary.to_numpy(zero_copy_only=False)
    perm = np.argsort(uniq, kind="stable")
    rank = np.empty(perm.size, dtype=np.int64)
    rank[perm] = np.arange(perm.size)
    return uniq[perm], rank[encoded.indices.to_numpy(zero_copy_only=False)]


def combine(codes: list[np.ndarray], cards: list[int], n: int) -> np.ndarray:
    """Mixed-radix combination of per-column codes into one int64 code per row."""
    total = 1
    for c in cards:
        total *= max(c, 1)
    if total < 2**62:
        combined = np.zeros(n, dtype=np.int64)
        for code, card in zip(codes, cards):
            combined = combined * max(card, 1) + code
        return combined
    # Too many combinations for one integer: fall back to row-wise unique.
    _, inverse = np.unique(np.stack(codes, axis=1), axis=0, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64)
