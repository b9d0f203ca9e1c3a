"""The scalar lookup of a grid (:class:`modperf.query.interp.Grid`) on plain lists, without numpy.

A :class:`Lattice` is what one scalar lookup reads of a grid: per axis its lattice values,
blend coordinates and strides, and per cell of the padded lattice its latency, state and
extrapolation distance, all as Python lists and dicts. :class:`modperf.query.interp.Grid` builds
them (numpy: the fill) and inherits the lookups from here, so there is one scalar lookup; a
process answering from a persisted plan (:mod:`modperf.fast.plans`) restores a Lattice from its
lists and answers with the same code, bit for bit, without importing numpy. The rules of the
lookup (blend coordinates, corners, extrapolation distance) are :mod:`modperf.query.interp`'s.
"""

from __future__ import annotations

import math
from bisect import bisect_right

TYPE_CHECKING = False
if TYPE_CHECKING:  # (typing costs a cold process ~5 ms: annotations only)
    from collections.abc import Sequence
    from typing import Any

#: Kind codes of the vectorised API (and their names in answers).
EXACT, INTERPOLATED, EXTRAPOLATED, REFUSED = 0, 1, 2, -1
KIND_NAMES = {EXACT: "exact", INTERPOLATED: "interpolated", EXTRAPOLATED: "extrapolated"}
#: Every kind code ``query_many`` returns -> its name (``modperf.KINDS``).
KINDS = {**KIND_NAMES, REFUSED: "refused"}

#: Cell states.
MEASURED_CELL, INTERPOLATED_CELL, EXTRAPOLATED_CELL, UNCOVERED_CELL = 0, 1, 2, 3

#: How far beyond the measurements modperf extrapolates, in octaves of (value + 1) summed over
#: the axes it had to leave: 1.0 allows one doubling of one axis (batch 256 -> 512, isl 16384
#: -> 32768, local heads 128 -> 256), or a half-doubling along two.
EXTRAPOLATION_LIMIT = 1.0

#: An offset no point on lattice values reaches (:attr:`Grid.offsets_py`): a sum holding it
#: stays negative.
MISSING_OFFSET = -(1 << 62)


def octave(x: float) -> float:
    """Distance unit for extrapolation: log2(value + 1), so that 0 (an empty prefix) is finite."""
    return math.log2(x + 1.0)


class Lookup:
    """One scalar lookup."""

    __slots__ = ("distance", "heads_used", "kind", "latency_ms", "outside")
    _FIELDS = ("latency_ms", "kind", "distance", "heads_used", "outside")  # (in the constructor's order)

    def __init__(self, latency_ms: float, kind: int, distance: float, heads_used: tuple[int, ...],
                 outside: tuple[str, ...]) -> None:
        self.latency_ms = latency_ms
        self.kind = kind
        self.distance = distance  # extrapolation distance spent (octaves); 0 unless extrapolated
        self.heads_used = heads_used  # lattice values of the heads axis that carried weight
        self.outside = outside  # axes the point lies beyond the measured range of

    def _values(self) -> tuple[Any, ...]:
        return (self.latency_ms, self.kind, self.distance, self.heads_used, self.outside)

    def __eq__(self, other: object) -> bool:
        if type(other) is not Lookup:
            return NotImplemented
        return self._values() == other._values()

    # mutable, compared by value
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return ("Lookup(" + ", ".join(f"{n}={v!r}" for n, v in zip(self._FIELDS, self._values())) + ")")


class Lattice:
    """A grid's lattice and fill as plain lists, with the scalar lookups.

    Attributes (set by :class:`modperf.query.interp.Grid` or :meth:`from_plain`): ``axes``,
    ``heads_pos`` (the heads axis's position, -1 without one), ``limit`` (extrapolation
    octaves), ``roofline`` (None on a restored lattice: it answers only inside the measured
    range), ``curvature`` per axis, ``_values_py`` (lattice values per axis), ``_pstrides``
    (strides of the lattice padded by one cell at the top of every axis), ``_u_py`` /
    ``_inv_py`` (blend coordinates per padded index and their inverse steps), ``lat_py`` /
    ``state_py`` / ``_dist_py`` (per padded cell: latency, state, distance)."""

    axes: tuple[str, ...]
    heads_pos: int
    limit: float
    roofline: Any  # Callable[[Sequence[Any]], Any], or None (a restored lattice)
    curvature: list[float]
    _values_py: list[list[int]]
    _pstrides: tuple[int, ...]
    _u_py: list[list[float]]
    _inv_py: list[list[float]]
    lat_py: list[float]
    state_py: list[int]
    _dist_py: list[float]
    # derived (_index_lists)
    _index_py: list[dict[Any, int]]
    offsets_py: list[dict[int, int]]
    _axes_py: list[tuple[Any, ...]]

    #: What :meth:`plain_parts` holds: every attribute a scalar lookup reads but the derived
    #: indexes (:meth:`_index_lists`).
    PLAIN = ("axes", "heads_pos", "limit", "curvature", "_values_py", "_pstrides", "_u_py", "_inv_py", "lat_py",
             "state_py", "_dist_py")

    def _index_lists(self) -> None:
        # per axis, lattice value -> index: a point on lattice values finds its cell without a
        # search (the exact-hit fast path of the scalar lookup)
        self._index_py = [{v: i for i, v in enumerate(vals)} for vals in self._values_py]
        #: per axis, lattice value -> its index times the axis's padded stride: the sum over a
        #: point's axes is its cell's index in ``lat_py`` / ``state_py`` when every value is a
        #: lattice value (``MISSING_OFFSET`` for one that is not keeps the sum negative)
        self.offsets_py = [{v: i * s for i, v in enumerate(vals)} for vals, s in zip(self._values_py, self._pstrides)]
        # per axis, what the scalar lookup reads, in one tuple: (values, value -> index, padded
        # stride, lowest, highest, curvature, blend coordinates, their inverse steps)
        self._axes_py = [(vals, index, pstride, vals[0], vals[-1], k, u, inv) for vals, index, pstride, k, u, inv
                         in zip(self._values_py, self._index_py, self._pstrides, self.curvature, self._u_py,
                                self._inv_py)]

    def __getattr__(self, name: str) -> Any:
        # the distances as a plain list, built on first use where the lattice holds them as an
        # array (a Grid's ``_dist_p``): an exact hit never reads them, and building them costs a
        # cold process's first answer ~40 ns a cell
        if name == "_dist_py" and "_dist_p" in self.__dict__:
            dist: list[float] = self.__dict__["_dist_p"].tolist()
            self.__dict__["_dist_py"] = dist
            return dist
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def plain_parts(self) -> tuple[Any, ...]:
        """The lattice as plain values (tuples, lists, ints, floats, strings), :data:`PLAIN` in
        order: what :meth:`from_plain` restores."""
        return tuple(getattr(self, name) for name in self.PLAIN)

    @classmethod
    def from_plain(cls, parts: Sequence[Any]) -> Lattice:
        """The lattice of :meth:`plain_parts` (without a roofline: :meth:`inside` says which
        points it answers). Raises ValueError on parts that do not fit together."""
        self = cls.__new__(cls)
        if len(parts) != len(cls.PLAIN):
            raise ValueError("lattice parts do not fit together")
        for name, value in zip(cls.PLAIN, parts):
            setattr(self, name, value)
        self.roofline = None
        n = len(self.axes)
        cells = 1
        for vals in self._values_py:
            cells *= len(vals) + 1
        if not (len(self.curvature) == len(self._values_py) == len(self._pstrides) == len(self._u_py)
                == len(self._inv_py) == n) or not len(self.lat_py) == len(self.state_py) == len(self._dist_py) == cells:
            raise ValueError("lattice parts do not fit together")
        self._index_lists()
        return self

    def inside(self, point: Sequence[int]) -> bool:
        """Whether ``point`` lies inside the measured range of every axis (a lookup there needs
        no roofline)."""
        for x, vals in zip(point, self._values_py):  # noqa: SIM110  (a loop: no generator per answer)
            if x < vals[0] or x > vals[-1]:
                return False
        return True

    # -- scalar lookup --------------------------------------------------------------------

    def lookup(self, point: Sequence[float]) -> Lookup:
        """Latency at ``point`` (one value per axis, in ``self.axes`` order)."""
        # fast path: every coordinate a lattice value and the cell measured (the stored latency,
        # as the general path below returns it)
        pstrides = self._pstrides
        base = 0
        heads: tuple[int, ...] = ()
        for a, x in enumerate(point):
            i = self._index_py[a].get(x)
            if i is None:
                break
            base += i * pstrides[a]
            if a == self.heads_pos:
                heads = (self._values_py[a][i],)
        else:
            if self.state_py[base] == MEASURED_CELL:
                return Lookup(self.lat_py[base], EXACT, 0.0, heads, ())
        return self.lookup_general(point)

    def lookup_general(self, point: Sequence[float]) -> Lookup:
        """:meth:`lookup` without its exact-hit fast path (the same answer: a point on a
        measured cell is that cell here too)."""
        outside: list[str] | None = None
        proj_dist = 0.0
        clipped: list[float] | None = None
        base = 0
        parts: list[tuple[int, float]] = []  # (padded stride, upper weight) of axes off a lattice value
        heads_used: tuple[int, ...] = ()
        heads_pos = self.heads_pos
        a = -1
        for x, (vals, index, pstride, low, high, k, u_py, inv_py) in zip(point, self._axes_py):
            a += 1
            i = index.get(x)
            if i is not None:  # on a lattice value (so inside the range): no search, weight 0
                base += i * pstride
                if a == heads_pos:
                    heads_used = (vals[i],)
                continue
            if x < low or x > high:
                xc = low if x < low else high
                proj_dist += abs(octave(x) - octave(xc))
                if outside is None:
                    outside, clipped = [], list(point)
                outside.append(self.axes[a])
                clipped[a] = xc  # type: ignore[index]
            else:
                xc = x
            i = bisect_right(vals, xc) - 1
            base += i * pstride
            if vals[i] == xc:
                t = 0.0
            else:
                xf = float(xc)
                u = xf if k == 0.0 else (xf * (1.0 + k * xf) if k > 0.0 else xf / (1.0 - k * xf))
                t = (u - u_py[i]) * inv_py[i]
                parts.append((pstride, t))
            if a == heads_pos:
                heads_used = (vals[i],) if t == 0.0 else (vals[i], vals[i + 1])
        lat, dist = self.lat_py, self._dist_py
        if not parts:
            if outside is None and self.state_py[base] == MEASURED_CELL:
                return Lookup(lat[base], EXACT, 0.0, heads_used, ())
            spent = dist[base] if dist[base] > 0.0 else 0.0
            value = lat[base]
        elif len(parts) == 1:  # one axis off a lattice value: the general code below, unrolled
            stride, t = parts[0]
            spent = 0.0
            if t < 1.0 and dist[base] > spent:
                spent = dist[base]
            if t > 0.0 and dist[base + stride] > spent:
                spent = dist[base + stride]
            lo = lat[base]
            value = lo + t * (lat[base + stride] - lo)
        elif len(parts) == 2:  # two axes off a lattice value: the general code below, unrolled
            (s0, t0), (s1, t1) = parts
            c1, c2 = base + s0, base + s1
            c3 = c2 + s0
            spent = 0.0
            if t0 < 1.0 and t1 < 1.0 and dist[base] > spent:
                spent = dist[base]
            if t0 > 0.0 and t1 < 1.0 and dist[c1] > spent:
                spent = dist[c1]
            if t0 < 1.0 and t1 > 0.0 and dist[c2] > spent:
                spent = dist[c2]
            if t0 > 0.0 and t1 > 0.0 and dist[c3] > spent:
                spent = dist[c3]
            lo, hi = lat[base], lat[c1]
            v0 = lo + t1 * (lat[c2] - lo)
            v1 = hi + t1 * (lat[c3] - hi)
            value = v0 + t0 * (v1 - v0)
        else:
            # corners in the order of the vectorised path: bit j of a corner is the upper side
            # of parts[j]; reduced along the last part first
            corners = [base]
            used = [True]
            spent = 0.0
            for stride, t in parts:
                corners = corners + [f + stride for f in corners]
                used = [w and t < 1.0 for w in used] + [w and t > 0.0 for w in used]
            for f, w in zip(corners, used):
                if w and dist[f] > spent:
                    spent = dist[f]
            values = [lat[f] for f in corners]
            for _, t in reversed(parts):
                half = len(values) // 2
                values = [lo + t * (hi - lo) for lo, hi in zip(values[:half], values[half:])]
            value = values[0]
        if spent == math.inf:
            return Lookup(math.nan, REFUSED, math.inf, heads_used, tuple(outside or ()))
        spent += proj_dist
        if spent > self.limit:
            return Lookup(math.nan, REFUSED, spent, heads_used, tuple(outside or ()))
        if outside is not None:
            assert clipped is not None
            r_at, r_edge = self.roofline(point), self.roofline(clipped)
            value *= r_at / r_edge if r_edge > 0 else math.nan
            return Lookup(value, EXTRAPOLATED if spent > 0.0 else INTERPOLATED, spent, heads_used, tuple(outside))
        return Lookup(value, EXTRAPOLATED if spent > 0.0 else INTERPOLATED, spent, heads_used, ())

    def between(self, point: Sequence[int], a: int, base: int) -> tuple[float, tuple[int, ...]] | None:
        """A single query's commonest point off the lattice, answered without a :class:`Lookup`:
        ``point`` (plain ints) is on lattice values but on axis ``a``, whose value lies inside
        the axis's range between two lattice values; ``base`` is the padded-lattice cell the
        other axes sum to (their ``offsets_py``). Returns (latency, lattice values of the heads axis that
        carry weight) as :meth:`lookup_general` answers such a point when it interpolates
        between measured or filled cells, or None where it would not (a point outside the
        range, or a bracket spending extrapolation distance or refused): ask it then."""
        vals, _, pstride, low, high, k, u_py, inv_py = self._axes_py[a]
        x = point[a]
        if x < low or x > high:
            return None
        i = bisect_right(vals, x) - 1
        lower = base + i * pstride
        upper = lower + pstride
        # the one-axis blend of lookup_general, its expressions in its order (bit for bit)
        xf = float(x)
        u = xf if k == 0.0 else (xf * (1.0 + k * xf) if k > 0.0 else xf / (1.0 - k * xf))
        t = (u - u_py[i]) * inv_py[i]
        dist = self._dist_py
        if (t < 1.0 and dist[lower] > 0.0) or (t > 0.0 and dist[upper] > 0.0):
            return None
        lat = self.lat_py
        lo = lat[lower]
        value = lo + t * (lat[upper] - lo)
        heads_pos = self.heads_pos
        if heads_pos < 0:
            return value, ()
        if a == heads_pos:
            return value, ((vals[i],) if t == 0.0 else (vals[i], vals[i + 1]))
        return value, (point[heads_pos],)  # a lattice value (an int equal to it)

    def support(self, point: Sequence[float]) -> list[dict[str, int]]:
        """The measured lattice cells an answer at ``point`` stands on (the corners of its
        interpolation box with weight > 0, after projecting onto the measured range), as axis
        values: the cell itself for an exact hit."""
        return [dict(zip(self.axes, cell)) for cell in self.support_values(point)]

    def support_values(self, point: Sequence[float]) -> list[tuple[int, ...]]:
        """:meth:`support`, each cell as its axis values in axis order."""
        corners: list[tuple[int, tuple[int, ...]]] = [(0, ())]  # per corner: (padded flat index, values)
        for x, (vals, index, pstride, low, high, *_) in zip(point, self._axes_py):
            i = index.get(x)
            if i is None:
                xc = min(max(x, low), high)
                i = bisect_right(vals, xc) - 1
                if vals[i] != xc and i + 1 < len(vals):
                    lo, hi = vals[i], vals[i + 1]
                    corners = [c for f, v in corners for c in ((f + i * pstride, (*v, lo)),
                                                               (f + (i + 1) * pstride, (*v, hi)))]
                    continue
            value, step = vals[i], i * pstride
            corners = [(f + step, (*v, value)) for f, v in corners]
        state = self.state_py
        return [v for f, v in corners if state[f] == MEASURED_CELL]

    def ranges(self) -> dict[str, tuple[int, int]]:
        return {a: (vals[0], vals[-1]) for a, vals in zip(self.axes, self._values_py)}
