"""Grid lookup inside one native group: exact hit, per-axis blend, or roofline extrapolation.

A *grid* is every bucket of a table that shares all key columns but the local head count (and,
for [native][local] families, one native). Its axes are the local heads (``num_heads``) and
the family's interpolation axes (``batch_size``, ``isl``, ``step``; ``num_tokens`` for
``mla_bmm``; ``m``, ``n``, ``k`` for GEMMs). The measured points sit on a lattice: the product
of every value each axis takes anywhere in the grid.

**Blend coordinate.** Every axis blends linearly in latency against a coordinate
``u(x) = x (1 + k x)`` (``k >= 0``: linear plus quadratic, e.g. causal attention over the new
tokens of a prefill) or ``u(x) = x / (1 - k x)`` (``k < 0``: saturating, e.g. work capped by a
window or a sparse top-k); ``k = 0`` is plain linear. ``k`` is chosen per grid and axis from
:data:`CURVATURES`: the one whose blend best predicts the grid's own measured points from
their nearest measured neighbours along that axis (mean relative leave-one-out error, each
point's error capped at :data:`_FIT_CAP`; ties go to the smaller ``|k|``, linear first; at most
:data:`_FIT_CELLS` points, an even subsample, take part). It is a data-driven work model: the
latency of a line is affine in ``u``.

**Cells.** Measurement grids are ragged (large isl x large batch is often missing, prefix
sweeps differ per isl), so lattice cells come in four states:

``MEASURED``       a stored point (after the loader's duplicate rule).
``INTERPOLATED``   missing, but bracketed along one or more axes by measured points of its own
                   line. Each such axis gives an estimate: the blend between the nearest
                   measured cell on either side. The estimates are averaged, each weighted by
                   ``(e^2 + 0.005^2)^-2`` where ``e`` is that axis blend's expected relative
                   error here: the *median* of its leave-one-out errors at (i) the two bracket
                   ends (each predicted from its own nearest measured neighbours along the
                   axis) and (ii) the measured cells one step away along the other axes, sides
                   and diagonals (the same blend, one line over); but never below the smaller
                   of the two ends' errors where both have one. An axis with no such evidence
                   gets ``e = 1``. The median keeps one outlier measurement nearby from
                   deciding the weights (a spike among the evidence would otherwise make every
                   axis look bad, the good one included); the floor keeps a spike *in the
                   bracket* from being outvoted: it throws both ends off their line (each end
                   is predicted through the other), and a blend through it is then bad
                   whatever the lines nearby say. The exponent (-2 on the squared error, i.e.
                   inverse variance squared) leans on the best-supported axis, since a handful
                   of residuals estimate each ``e`` only roughly.
``EXTRAPOLATED``   not bracketed along any axis: filled from the nearest covered cell along an
                   axis line by holding its roofline utilisation (see :mod:`modperf.specs.roofline`),
                   with its *extrapolation distance* (octaves of value + 1, summed along the
                   path) recorded. Only cells within :data:`EXTRAPOLATION_LIMIT` are filled.
``UNCOVERED``      farther than the limit from any measurement: a query that needs it is refused.

**Queries.** A query is a point; per axis it finds the lattice interval around it and the
corners are blended multilinearly (one axis after the other, each linear in latency against
its coordinate ``u``). A point on a lattice cell is that cell; a point on a lattice line
between two cells gets that axis's 1-D blend, the rule a missing cell's estimate along the
axis follows (there between its nearest measured cells). A query outside
an axis's lattice range is projected onto the edge, answered there, and scaled by the roofline
ratio; the projection adds its own distance. The answer is ``exact`` when the point is a
measured cell (the stored latency is returned bit for bit), ``extrapolated`` when any
extrapolation distance was spent (a corner with weight > 0 was extrapolated, or the point was
projected), else ``interpolated``. Past the limit it is refused. The vectorised path follows
the scalar one operation for operation: its answers are the same bit for bit.
"""

from __future__ import annotations

import functools
import itertools
import math
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..fast.lattice import (  # noqa: F401  (re-exported: the scalar lookup's names, where they always were)
    EXACT,
    EXTRAPOLATED,
    EXTRAPOLATED_CELL,
    EXTRAPOLATION_LIMIT,
    INTERPOLATED,
    INTERPOLATED_CELL,
    KIND_NAMES,
    MEASURED_CELL,
    MISSING_OFFSET,
    REFUSED,
    UNCOVERED_CELL,
    Lattice,
    Lookup,
    octave,
)

#: Curvatures ``k`` an axis's blend coordinate is chosen from: linear, then convex and concave
#: with the crossover ``1 / |k|`` at every power of 4 from 4^10 (about 1M) down to 1, mildest
#: first (a tie goes to the earlier one).
CURVATURES = (0.0, *(s * 4.0 ** -j for j in range(10, -1, -1) for s in (1.0, -1.0)))

#: Relative error added (in quadrature) to every axis's expected error when a missing cell
#: combines its axis estimates: no axis is trusted beyond measurement noise (about 0.5 %).
_ERROR_FLOOR = 0.005

#: A missing cell's axis estimates are averaged with weights ``(e^2 + floor^2)^-power``, ``e``
#: the axis blend's expected relative error there (module doc).
_WEIGHT_POWER = 2.0

#: Leave-one-out errors above this count as this much when a curvature is fitted (one broken
#: measurement must not choose the coordinate of a whole grid).
_FIT_CAP = 0.5

#: At most this many measured cells (an even subsample) choose an axis's curvature.
_FIT_CELLS = 4096

#: Vectorised lookups work through this many points at a time.
_CHUNK = 1 << 15

#: Vectorised lookups map integer-valued coordinates to lattice intervals through a table
#: this long at most (larger axes use a binary search).
_LUT_MAX = 1 << 22

#: Roofline seconds: receives one value per axis, in grid axis order (floats, or arrays of one
#: shape), returns a float or an array.
Roofline = Callable[[Sequence[Any]], Any]


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` (sorted distinct values), without it: numpy 2's ``unique`` imports
    ``numpy.ma`` on its first call (~13 ms of a cold query)."""
    out = np.sort(values, axis=None)
    if out.size > 1:
        out = out[np.concatenate(([True], out[1:] != out[:-1]))]
    return out


def curve(x: Any, k: float) -> Any:
    """The blend coordinate ``u(x)`` of curvature ``k`` (floats or arrays)."""
    if k == 0.0:
        return x
    if k > 0.0:
        return x * (1.0 + k * x)
    return x / (1.0 - k * x)


class Grid(Lattice):
    """The measured points of one native group on a lattice, with its fill (see module doc)."""

    def __init__(self, axes: Sequence[str], points: Mapping[str, np.ndarray], latency: np.ndarray,
                 roofline: Roofline, *, heads_axis: str | None = None, limit: float = EXTRAPOLATION_LIMIT) -> None:
        self.axes = tuple(axes)
        self.heads_axis = heads_axis
        self.heads_pos = self.axes.index(heads_axis) if heads_axis in self.axes else -1
        self.limit = float(limit)
        self.roofline = roofline
        self.values = [sorted_unique(np.asarray(points[a], dtype=np.int64)) for a in self.axes]
        self.shape = tuple(int(v.size) for v in self.values)
        self.strides = _strides(self.shape)
        self.octaves = [np.log2(v.astype(np.float64) + 1.0) for v in self.values]
        index = tuple(np.searchsorted(v, np.asarray(points[a], dtype=np.int64)) for a, v in zip(self.axes, self.values))
        self.n_measured = int(latency.size)
        self.curvature = [0.0] * len(self.axes)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            self._fill(index, np.asarray(latency, dtype=np.float64))
        self.coords = [curve(v.astype(np.float64), k) for v, k in zip(self.values, self.curvature)]
        self._prepare_lookup()

    def fill_parts(self) -> dict[str, np.ndarray]:
        """What building this grid computed, as arrays (the persisted cache keeps them beside a
        table's entry): :meth:`restore` makes the same grid from them without the fill."""
        parts = {f"values:{a}": v for a, v in enumerate(self.values)}
        parts["curvature"] = np.asarray(self.curvature, dtype=np.float64)
        parts["n_measured"] = np.asarray([self.n_measured], dtype=np.int64)
        for name in ("latency", "state", "distance"):
            parts[name] = getattr(self, name)
        return parts

    @classmethod
    def restore(cls, axes: Sequence[str], parts: Mapping[str, np.ndarray], roofline: Roofline, *,
                heads_axis: str | None = None, limit: float = EXTRAPOLATION_LIMIT) -> Grid:
        """The grid whose :meth:`fill_parts` are ``parts`` (every attribute a lookup reads is
        the built grid's, bit for bit: the arrays are the stored ones, the rest is derived from
        them by the constructor's own expressions). Raises ValueError on parts that do not
        fit together."""
        self = cls.__new__(cls)
        self.axes = tuple(axes)
        self.heads_axis = heads_axis
        self.heads_pos = self.axes.index(heads_axis) if heads_axis in self.axes else -1
        self.limit = float(limit)
        self.roofline = roofline
        self.values = [np.asarray(parts[f"values:{a}"], dtype=np.int64) for a in range(len(self.axes))]
        self.shape = tuple(int(v.size) for v in self.values)
        self.strides = _strides(self.shape)
        self.octaves = [np.log2(v.astype(np.float64) + 1.0) for v in self.values]
        self.n_measured = int(parts["n_measured"][0])
        self.curvature = [float(k) for k in parts["curvature"].tolist()]
        self.latency = np.asarray(parts["latency"], dtype=np.float64)
        self.state = np.asarray(parts["state"], dtype=np.uint8)
        self.distance = np.asarray(parts["distance"], dtype=np.float64)
        # (the roofline per cell, ``roof``, only where asked: the cached property)
        if len(self.curvature) != len(self.axes) or any(
                x.shape != self.shape for x in (self.latency, self.state, self.distance)):
            raise ValueError("grid parts do not fit together")
        self.coords = [curve(v.astype(np.float64), k) for v, k in zip(self.values, self.curvature)]
        self._prepare_lookup()
        return self

    # -- building ------------------------------------------------------------------------

    def _mesh(self) -> tuple[np.ndarray, ...]:
        return np.meshgrid(*[v.astype(np.float64) for v in self.values], indexing="ij")

    def _roof_cells(self) -> np.ndarray:
        """The roofline seconds of every lattice cell (NaN where not positive)."""
        roof = np.asarray(self.roofline(self._mesh()), dtype=np.float64).ravel()
        return np.where(roof > 0, roof, np.nan).reshape(self.shape)

    def _fill(self, index: tuple[np.ndarray, ...], latency: np.ndarray) -> None:
        # flat arrays over the lattice; per axis, a (outer, n, inner) view finds line neighbours
        shape = self.shape
        size = math.prod(shape)
        flat = np.ravel_multi_index(index, shape) if index else np.zeros(latency.size, dtype=np.intp)
        lat = np.full(size, np.nan)
        lat[flat] = latency
        state = np.full(size, UNCOVERED_CELL, dtype=np.uint8)
        state[flat] = MEASURED_CELL
        dist = np.zeros(size)
        measured = state == MEASURED_CELL
        cells = np.arange(size)

        roof = self._roof_cells().ravel()
        self.roof = roof.reshape(shape)

        # interior cells: every axis that brackets the cell gives an estimate; the estimates
        # are averaged with weights from the expected error of each axis's blend here
        num = np.zeros(size)
        den = np.zeros(size)
        for a in range(len(shape)):
            if shape[a] < 3:
                continue
            found = self._axis_estimate(a, lat, measured, cells)
            if found is None:
                continue
            missing, est, err = found
            w = (err * err + _ERROR_FLOOR * _ERROR_FLOOR) ** -_WEIGHT_POWER
            num[missing] += est * w
            den[missing] += w
        interior = den > 0
        lat[interior] = num[interior] / den[interior]
        state[interior] = INTERPOLATED_CELL

        # exterior cells: hold the utilisation of the nearest covered cell along an axis line
        covered = state != UNCOVERED_CELL
        if not covered.all():
            for _ in range(2 * len(shape) + 2):
                best_d = np.full(size, np.inf)
                best_v = np.full(size, np.nan)
                todo = np.flatnonzero(~covered)
                for a in range(len(shape)):
                    n = shape[a]
                    if n < 2:
                        continue
                    inner = self.strides[a]
                    view = (-1, n, inner)
                    prev, nxt = _neighbours(covered.reshape(view), 1)
                    here = (todo // inner) % n
                    o = self.octaves[a]
                    for anchor, valid in ((prev, prev >= 0), (nxt, nxt < n)):
                        ai = anchor.ravel()[todo]
                        ok = valid.ravel()[todo]
                        if not ok.any():
                            continue
                        t, ai, hi = todo[ok], ai[ok], here[ok]
                        f = t + (ai - hi) * inner
                        d = np.abs(o[hi] - o[ai]) + dist[f]
                        v = lat[f] * roof[t] / roof[f]
                        better = (d < best_d[t]) & (d <= self.limit) & np.isfinite(v)
                        best_d[t[better]] = d[better]
                        best_v[t[better]] = v[better]
                new = np.isfinite(best_d)
                if not new.any():
                    break
                lat[new] = best_v[new]
                dist[new] = best_d[new]
                state[new] = EXTRAPOLATED_CELL
                covered |= new
        self.latency, self.state, self.distance = lat.reshape(shape), state.reshape(shape), dist.reshape(shape)

    def _axis_estimate(self, a: int, lat: np.ndarray, measured: np.ndarray,
                       cells: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Along axis ``a`` (flat lattice arrays): fit the axis's curvature, then for every
        missing cell bracketed by measured cells of its line, the blend between the nearest
        measured cell on each side and the expected relative error of that blend (module doc).
        Returns (missing cells, estimates, errors)."""
        shape = self.shape
        n = shape[a]
        inner = self.strides[a]
        prev, nxt = _strict_neighbours(measured.reshape(-1, n, inner), 1)
        prev, nxt = prev.ravel(), nxt.ravel()
        valid = (prev >= 0) & (nxt < n)
        if not valid.any():
            return None
        here = (cells // inner) % n
        rows = np.flatnonzero(valid)
        h, p_i, n_i = here[rows], prev[rows], nxt[rows]
        fp = rows + (p_i - h) * inner
        fn = rows + (n_i - h) * inner
        y0, y1, y = lat[fp], lat[fn], lat[rows]
        x = self.values[a].astype(np.float64)
        fit = measured[rows]
        k = _fit_curvature(x, h[fit], p_i[fit], n_i[fit], y0[fit], y1[fit], y[fit])
        self.curvature[a] = k
        u = curve(x, k)
        u0 = u[p_i]
        est = y0 + (u[h] - u0) / (u[n_i] - u0) * (y1 - y0)
        missing = ~fit
        if not missing.any():
            return None
        resid = np.full(lat.size, np.nan)
        r = np.abs(est[fit] / y[fit] - 1.0)
        resid[rows[fit]] = np.where(np.isfinite(r), r, np.nan)
        m_rows = rows[missing]
        # (i) at the bracket ends (for a missing cell they bracket each other) and (ii) at the
        # cells one step away along the other axes, sides and diagonals (the same blend, one
        # line over); their median, but never below the smaller of the two ends' errors (when
        # both ends are off their line, the blend through them is, whatever the lines nearby)
        ends = np.stack([resid[fp[missing]], resid[fn[missing]]])
        err = _nanmedian(np.concatenate([ends, _neighbour_values(resid.reshape(shape), a, m_rows)]))
        both = np.isfinite(ends).all(axis=0)
        err = np.where(both, np.fmax(err, np.where(both, ends.min(axis=0), 0.0)), err)
        err = np.where(np.isfinite(err), err, 1.0)
        return m_rows, est[missing], err

    def _prepare_lookup(self) -> None:
        """Lookup tables: the lattice padded by one cell at the top of every axis (a copy of the
        last), so that a point on the last value of an axis is the lower corner of an interval
        of weight 0 above; uncovered cells hold latency 0 (never used with weight > 0) and an
        infinite distance."""
        lat = np.where(self.state == UNCOVERED_CELL, 0.0, self.latency)
        dist = np.where(self.state == UNCOVERED_CELL, np.inf, self.distance)
        self._pshape = tuple(n + 1 for n in self.shape)
        self._pstrides = _strides(self._pshape)
        self._lat_p = _pad_top_edge(lat).ravel()
        self._dist_p = _pad_top_edge(dist).ravel()
        self._state_p = _pad_top_edge(self.state).ravel()
        self._u_p, self._inv_p = [], []
        for u in self.coords:
            up = np.append(u, u[-1])
            inv = np.zeros(up.size)
            if u.size > 1:
                inv[: u.size - 1] = 1.0 / np.diff(u)
            self._u_p.append(up)
            self._inv_p.append(inv)
        self._flags: dict[tuple[int, ...], np.ndarray] = {}
        self._luts: dict[int, np.ndarray | None] = {}
        # plain-Python mirrors for the scalar path (numpy calls cost ~1 us each)
        self._values_py = [v.tolist() for v in self.values]
        self._u_py = [u.tolist() for u in self._u_p]
        self._inv_py = [i.tolist() for i in self._inv_p]
        #: per cell of the padded lattice (flat): its latency and its state, as plain lists
        self.lat_py = self._lat_p.tolist()
        # (the distances' list, ``_dist_py``, only on a lookup between or beyond measured
        # cells: see __getattr__)
        self.state_py = self._state_p.tolist()
        self._index_lists()

    @functools.cached_property
    def roof(self) -> np.ndarray:
        """A restored grid's roofline per cell, built where asked (what its fill computed, the
        same expression; a grid that fills sets it then)."""
        if "roofline" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute 'roof'")
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return self._roof_cells()

    # -- vectorised lookup ----------------------------------------------------------------

    def lookup_many(self, points: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """Latencies and kind codes for arrays of points (one array or scalar per axis,
        broadcastable). Refused points get NaN and kind REFUSED; nothing raises."""
        value, kind, _ = self.lookup_many_spent(points)
        return value, kind

    def lookup_many_spent(self, points: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`lookup_many` and the octaves each point spends outside the measured cells
        (the scalar lookup's ``distance``: infinite where no measurement reaches; 0 for NaN
        coordinates)."""
        arrays = [np.asarray(p) for p in points]
        n_shape = np.broadcast_shapes(*[x.shape for x in arrays])
        cols: list[np.ndarray | float] = []
        for x in arrays:
            if x.size == 1:
                cols.append(x.reshape(()).item())
            else:
                cols.append(np.ravel(np.broadcast_to(x, n_shape)))
        n = math.prod(n_shape)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            value, kind, spent = self._lookup_flat(cols, n)
        return value.reshape(n_shape), kind.reshape(n_shape), spent.reshape(n_shape)

    def _lookup_flat(self, cols: list[np.ndarray | float], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """In chunks: the working arrays of a chunk stay in cache and are recycled by the
        allocator (fresh arrays of a million points cost more in page faults than in
        arithmetic)."""
        if n <= _CHUNK:
            return self._lookup_chunk(cols, n)
        value = np.empty(n)
        kind = np.empty(n, dtype=np.int8)
        spent = np.empty(n)
        for lo in range(0, n, _CHUNK):
            hi = min(n, lo + _CHUNK)
            part = [c[lo:hi] if isinstance(c, np.ndarray) else c for c in cols]
            value[lo:hi], kind[lo:hi], spent[lo:hi] = self._lookup_chunk(part, hi - lo)
        return value, kind, spent

    def _lookup_chunk(self, cols: list[np.ndarray | float], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if n == 0:
            return np.zeros(0), np.zeros(0, dtype=np.int8), np.zeros(0)
        base: np.ndarray | int = 0
        lerp: list[tuple[int, int, np.ndarray | float]] = []  # (axis, padded stride, upper weight)
        clipped: list[np.ndarray | float] = list(cols)
        outside: np.ndarray | None = None  # points beyond the range of some axis
        all_outside = False  # every point is (a scalar axis beyond its range)
        proj: np.ndarray | float = 0.0  # octaves spent projecting onto the range
        bad: np.ndarray | None = None  # NaN coordinates
        on_lattice: np.ndarray | None = None  # on a lattice value of every array axis
        scalar_off = False  # a scalar axis between lattice values: no point is exact
        scratch = None
        # names shared by the scalar-axis and array-axis branches (and the weights of lerp)
        xf: float | np.ndarray
        i: int | np.ndarray
        t: np.ndarray | float
        for a, x in enumerate(cols):
            vals = self.values[a]
            lo, hi = int(vals[0]), int(vals[-1])
            stride = self._pstrides[a]
            if not isinstance(x, np.ndarray):  # one value for every point
                xf = float(x)
                if math.isnan(xf):
                    return np.full(n, np.nan), np.full(n, REFUSED, dtype=np.int8), np.zeros(n)
                xc = min(max(xf, lo), hi)
                if xc != xf:
                    proj = proj + abs(octave(xf) - octave(xc))
                    all_outside = True
                    clipped[a] = xc
                i = bisect_right(self._values_py[a], xc) - 1
                base = base + i * stride
                if self._values_py[a][i] != xc:
                    k = self.curvature[a]
                    u = xc if k == 0.0 else (xc * (1.0 + k * xc) if k > 0.0 else xc / (1.0 - k * xc))
                    lerp.append((a, stride, (u - self._u_py[a][i]) * self._inv_py[a][i]))
                    scalar_off = True
                continue
            if not (x.min() >= lo and x.max() <= hi):  # beyond the range, or NaN
                nan = np.isnan(x) if x.dtype.kind == "f" else np.zeros(n, dtype=bool)
                if nan.any():
                    bad = nan if bad is None else bad | nan
                    x = np.where(nan, lo, x)
                xc = np.clip(x, lo, hi)
                out = xc != x
                if out.any():
                    # by the scalar function, as the scalar lookup has it (np.log2 may differ
                    # from it in the last bit): the distance spent is the scalar lookup's
                    sel = np.flatnonzero(out)
                    gone = np.zeros(n)
                    gone[sel] = np.abs(_octaves(x[sel]) - _octaves(xc[sel]))
                    proj = proj + gone
                    outside = out if outside is None else outside | out
                x = xc
                clipped[a] = xc
            # (fresh arrays cost page faults: work in place where the arithmetic allows it)
            i = self._interval(a, x)
            t = np.empty(n)
            np.copyto(t, x, casting="unsafe")
            if scratch is None:
                scratch = np.empty(n)
            k = self.curvature[a]
            if k != 0.0:  # u(x), in the operation order of curve()
                np.multiply(t, k, out=scratch)
                if k > 0.0:
                    scratch += 1.0
                    t *= scratch
                else:
                    np.subtract(1.0, scratch, out=scratch)
                    t /= scratch
            t -= np.take(self._u_p[a], i, out=scratch)
            t *= np.take(self._inv_p[a], i, out=scratch)
            if stride != 1:
                np.multiply(i, stride, out=i)
            if isinstance(base, np.ndarray):
                base += i
            else:
                i += base
                base = i
            lerp.append((a, stride, t))
            if on_lattice is None:
                on_lattice = t == 0.0
            else:
                on_lattice &= t == 0.0
        if not isinstance(base, np.ndarray):
            base = np.full(n, base, dtype=np.intp)

        # the value: successive 1-D blends over the axes with weight off a lattice value, the
        # last axis first (uncovered cells hold 0 and only ever get weight 0 here)
        lat = self._lat_p
        offsets = [0]
        for _, stride, _ in lerp:
            offsets = offsets + [o + stride for o in offsets]
        values = [np.take(lat[o:], base) for o in offsets]
        for _, _, t in reversed(lerp):
            half = len(values) // 2
            for lo_v, hi_v in zip(values[:half], values[half:]):
                hi_v -= lo_v
                hi_v *= t
                hi_v += lo_v
            values = values[half:]
        value = values[0]
        kind = np.full(n, INTERPOLATED, dtype=np.int8)

        # distance spent: 0 unless a corner box holds an extrapolated or uncovered cell; then,
        # on those points only, the largest distance over the corners that carry weight
        spent = None
        slow = np.flatnonzero(np.take(self._flag(tuple(a for a, _, _ in lerp)), base))
        if slow.size:
            sb = base[slow]
            spent = np.zeros(slow.size)
            boxes = [(0, np.ones(slow.size, dtype=bool))]
            for _, stride, t in lerp:
                ts = t[slow] if isinstance(t, np.ndarray) else np.full(slow.size, t)
                boxes = [(o, w & (ts < 1.0)) for o, w in boxes] + [(o + stride, w & (ts > 0.0)) for o, w in boxes]
            for o, w in boxes:
                np.maximum(spent, np.where(w, self._dist_p[sb + o], 0.0), out=spent)
        total = None
        if spent is not None or outside is not None or all_outside:
            total = np.zeros(n)
            if spent is not None:
                total[slow] = spent
            total += proj
            kind[total > 0.0] = EXTRAPOLATED

        # exact: a measured cell, every coordinate on its lattice value, inside the range
        if not scalar_off and not all_outside:
            if on_lattice is None:
                cand = np.arange(n)
            else:
                if outside is not None:
                    on_lattice &= ~outside
                cand = np.flatnonzero(on_lattice)
            if cand.size:
                cb = base[cand]
                hit = self._state_p[cb] == MEASURED_CELL
                kind[cand[hit]] = EXACT
                value[cand[hit]] = lat[cb[hit]]

        # beyond the range: the edge's answer scaled by the roofline ratio
        if outside is not None or all_outside:
            sel = np.arange(n) if all_outside or outside is None else np.flatnonzero(outside)
            at = [c[sel] if isinstance(c, np.ndarray) else c for c in cols]
            edge = [c[sel] if isinstance(c, np.ndarray) else c for c in clipped]
            r_at = np.asarray(self.roofline(at), dtype=np.float64)
            r_edge = np.asarray(self.roofline(edge), dtype=np.float64)
            value[sel] *= r_at / r_edge
        refused = total > self.limit if total is not None else None
        if bad is not None:
            refused = bad if refused is None else refused | bad
        if refused is not None and refused.any():
            kind[refused] = REFUSED
            value[refused] = np.nan
        return value, kind, total if total is not None else np.zeros(n)

    def _interval(self, a: int, x: np.ndarray) -> np.ndarray:
        """Index of the lattice value at or below every ``x`` (inside the axis's range)."""
        lut = self._luts.get(a, False)
        if lut is False:
            top = int(self.values[a][-1])
            lut = None
            if self.values[a][0] >= 0 and top < _LUT_MAX:
                lut = (np.searchsorted(self.values[a], np.arange(top + 1), side="right") - 1).astype(np.intp)
            self._luts[a] = lut
        if lut is not None:
            # lattice values are integers: floor(x) falls in the same interval as x
            return np.take(lut, x if x.dtype == np.intp else x.astype(np.intp))
        return np.searchsorted(self.values[a], x, side="right") - 1

    def _flag(self, moving: tuple[int, ...]) -> np.ndarray:
        """Per lower corner (padded flat index): the largest distance over the cells of its
        interval box along the axes in ``moving`` (0: every corner measured or interpolated)."""
        flag = self._flags.get(moving)
        if flag is None:
            flag = self._dist_p.copy()
            for a in moving:
                s = self._pstrides[a]
                flag[:-s] = np.maximum(flag[:-s], flag[s:])
            self._flags[moving] = flag
        return flag

    # -- description ----------------------------------------------------------------------

    def _measured_octaves(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """The measured cells' flat indices and their octaves per axis (once per grid: every
        refusal asks)."""
        measured = self.__dict__.get("_measured_octaves_kept")
        if measured is None:
            idx = np.flatnonzero(self.state.ravel() == MEASURED_CELL)
            sub = np.unravel_index(idx, self.shape)
            measured = (idx, [self.octaves[a][sub[a]] for a in range(len(self.shape))])
            self.__dict__["_measured_octaves_kept"] = measured
        return measured

    def nearest_covered(self, point: Sequence[float], count: int = 3) -> list[dict[str, int]]:
        """The measured lattice points closest to ``point`` (octave distance), for error messages."""
        idx, octs = self._measured_octaves()
        if idx.size == 0:
            return []
        d = np.zeros(idx.size)
        for a, x in enumerate(point):
            d += np.abs(octs[a] - octave(float(x)))
        if count >= 1 and idx.size > 4 * count:
            # the nearest ``count`` in a stable order (ties by cell index), without sorting all:
            # every cell at or below the count-th smallest distance, then those in stable order
            kth = np.partition(d, count - 1)[count - 1]
            near = np.flatnonzero(d <= kth)
            best = idx[near[np.argsort(d[near], kind="stable")[:count]]]
        else:
            best = idx[np.argsort(d, kind="stable")[:count]]
        out = []
        for f in best:
            s = np.unravel_index(int(f), self.shape)
            out.append({a: int(self.values[i][s[i]]) for i, a in enumerate(self.axes)})
        return out

    def nearest_covered_many(self, points: Sequence[np.ndarray | int], count: int = 3) -> np.ndarray:
        """:meth:`nearest_covered` for many points at once (one array or int per axis): the
        axis values of the nearest ``count`` measured cells, shape (points, found, axes) --
        the same cells in the same order as the scalar search (distances summed in the same
        order, ties by cell index).

        The measured cells are searched block by block (:meth:`_nearest_blocks`: the cells
        sharing their first axes' values), and a block is searched for a point only where the
        distance its first axes alone add up to is within the ``count``-th smallest distance
        of the block nearest by that sum: the first axes' distance, summed first as the scalar
        search sums it, can only grow as the other axes' are added (a sum of non-negative
        floats rounds to at least its first part), so every cell a skipped block holds is
        farther, and the search finds every cell the scalar search ranks among its nearest,
        ties included."""
        idx, _ = self._measured_octaves()
        sub = np.unravel_index(idx[self.nearest_covered_at(points, count)], self.shape)
        return np.stack([np.asarray(self.values[a])[sub[a]] for a in range(len(self.axes))], axis=-1).astype(np.int64)

    def measured_cell(self, position: int) -> tuple[int, ...]:
        """The axis values of the measured cell at ``position`` (in flat order among the
        measured cells, as :meth:`nearest_covered_at` gives them)."""
        idx, _ = self._measured_octaves()
        s = np.unravel_index(int(idx[position]), self.shape)
        return tuple(int(self.values[a][s[a]]) for a in range(len(self.axes)))

    def nearest_covered_at(self, points: Sequence[np.ndarray | int], count: int = 3) -> np.ndarray:
        """:meth:`nearest_covered_many` as the cells' positions among the measured cells (in
        flat order), shape (points, found)."""
        idx, _ = self._measured_octaves()
        n = max([p.size for p in points if isinstance(p, np.ndarray)], default=1)
        k = min(count, idx.size)
        blocks = self._nearest_blocks(k) if k > 0 else None
        if blocks is None:
            found = self._nearest_dense(points, n, k)
        else:
            # per axis: each point's distance to each lattice value (as the scalar search has
            # it: |the cell's octave - the point's|), or one row for every point (a scalar axis)
            terms: list[np.ndarray] = []
            for a, p in enumerate(points):
                if isinstance(p, np.ndarray):
                    uniq, inverse = np.unique(p, return_inverse=True)
                    x = np.array([octave(float(v)) for v in uniq.tolist()])[inverse.ravel()]
                    terms.append(np.abs(self.octaves[a][None, :] - x[:, None]))
                else:
                    terms.append(np.abs(self.octaves[a] - octave(float(p))))
            found = np.empty((n, k), dtype=np.intp)
            step = 4096
            for lo in range(0, n, step):
                hi = min(n, lo + step)
                part = [t[lo:hi] if t.ndim == 2 else t for t in terms]
                found[lo:hi] = self._nearest_in_blocks(part, hi - lo, k, blocks)
        return found

    def _nearest_blocks(self, k: int) -> tuple[Any, ...] | None:
        """The measured cells in blocks of equal values on the first ``q`` axes (the most
        axes whose blocks hold 8 cells on average; in flat order a block's cells are
        consecutive): ``(q, each block's index on each of those axes, its cells' positions
        among the measured cells padded to the widest block, which of those are cells, its
        cells' indices on each other axis, the blocks holding at least k cells)``; None where
        no such blocks exist (the dense search is as quick there)."""
        kept = self.__dict__.setdefault("_nearest_blocks_kept", {})
        if k in kept:
            return kept[k]
        idx, _ = self._measured_octaves()
        sub = np.unravel_index(idx, self.shape)
        found: tuple[Any, ...] | None = None
        for q in range(len(self.shape) - 1, 0, -1):
            prefix = np.ravel_multi_index(sub[:q], self.shape[:q])
            starts = np.flatnonzero(np.concatenate(([True], prefix[1:] != prefix[:-1])))
            if idx.size < 64 or idx.size < 8 * starts.size:
                continue
            sizes = np.diff(np.append(starts, idx.size))
            width = int(sizes.max())
            pos = starts[:, None] + np.arange(width)[None, :]
            valid = np.arange(width)[None, :] < sizes[:, None]
            pos = np.where(valid, pos, 0)
            full = np.flatnonzero(sizes >= k)
            if full.size:
                rest = [s[pos] for s in sub[q:]]
                # each block's lowest and highest index on each other axis
                hull = [(np.where(valid, r, np.iinfo(np.intp).max).min(axis=1), np.where(valid, r, -1).max(axis=1))
                        for r in rest]
                found = (q, [s[starts] for s in sub[:q]], pos, valid, rest, hull, full)
            break
        kept[k] = found
        return found

    @staticmethod
    def _nearest_in_blocks(terms: list[np.ndarray], n: int, k: int, blocks: tuple[Any, ...]) -> np.ndarray:
        """The positions among the measured cells of the nearest ``k`` to each of ``n`` points
        (:meth:`nearest_covered_many`), from the per-axis distances ``terms``."""
        q, block_sub, pos, valid, cell_sub, hull, full = blocks
        rows = np.arange(n)

        def term(a: int, index: np.ndarray, at: np.ndarray) -> np.ndarray:
            t = terms[a]
            return t[index] if t.ndim == 1 else t[at, index]

        # the first q axes' distance to every block, summed in the scalar search's order
        head = np.zeros((n, block_sub[0].size))
        for a in range(q):
            head += terms[a][..., block_sub[a]]

        def cells(at: np.ndarray, block: np.ndarray) -> np.ndarray:
            d = head[at, block][:, None]
            for a in range(q, len(terms)):
                d = d + term(a, cell_sub[a - q][block], at[:, None])
            return np.where(valid[block], d, np.inf)

        # below every cell's distance in a block: its first axes' distance plus, per other
        # axis, the least distance to a value within the block's range of that axis (the
        # distances to an axis's values fall, then rise: the least within a range is at the
        # value nearest the overall least), added in the scalar search's order
        low = head
        for a in range(q, len(terms)):
            t = terms[a]
            lo, hi = hull[a - q]
            if t.ndim == 1:
                low = low + t[np.clip(int(np.argmin(t)), lo, hi)][None, :]
            else:
                low = low + t[rows[:, None], np.clip(np.argmin(t, axis=1)[:, None], lo[None, :], hi[None, :])]
        # a bound: the k-th smallest distance within the two blocks lowest so (one of them
        # holding at least k cells)
        lowest = full[np.argmin(low[:, full], axis=1)]
        near = cells(rows, lowest)
        if low.shape[1] > 1:
            other = low.copy()
            other[rows, lowest] = np.inf
            near = np.concatenate((near, cells(rows, np.argmin(other, axis=1))), axis=1)
        bound = np.partition(near, k - 1, axis=1)[:, k - 1]
        at, block = np.nonzero(low <= bound[:, None])
        d = cells(at, block)
        r, c = np.nonzero(d <= bound[at][:, None])
        # (in the order of point, then cell: the blocks' cells are consecutive, in flat order)
        point, dist, cell = at[r], d[r, c], pos[block[r], c]
        order = np.lexsort((dist, point))
        point, cell = point[order], cell[order]
        first = np.searchsorted(point, rows)
        return cell[first[:, None] + np.arange(k)[None, :]]

    def _nearest_dense(self, points: Sequence[np.ndarray | int], n: int, k: int) -> np.ndarray:
        """:meth:`nearest_covered_many`'s positions among the measured cells, every cell's
        distance to every point."""
        idx, octs = self._measured_octaves()
        found = np.empty((n, k), dtype=np.intp)
        if k > 0:
            # each distinct coordinate's octave by the scalar function, as the scalar search has it
            # per axis: each point's octave (an array axis), or the distances of every cell
            # (one value for every point: one row, added to every row)
            terms: list[tuple[bool, np.ndarray]] = []
            for a, p in enumerate(points):
                if isinstance(p, np.ndarray):
                    uniq, inverse = np.unique(p, return_inverse=True)
                    terms.append((True, np.array([octave(float(x)) for x in uniq.tolist()])[inverse.ravel()]))
                else:
                    terms.append((False, np.abs(octs[a] - octave(float(p)))))
            block = max(1, (1 << 18) // idx.size)
            scratch = np.empty((block, idx.size))
            for lo in range(0, n, block):
                hi = min(n, lo + block)
                d = np.zeros((hi - lo, idx.size))
                part = scratch[:hi - lo]
                for a, (per_point, term) in enumerate(terms):
                    if per_point:
                        np.subtract(octs[a][None, :], term[lo:hi, None], out=part)
                        d += np.abs(part, out=part)
                    else:
                        d += term
                if idx.size > k:
                    # every cell at or below the k-th smallest distance of its row, ordered by
                    # (row, distance, cell index); the first k of each row
                    kth = np.partition(d, k - 1, axis=1)[:, k - 1]
                    rows, cells = np.nonzero(d <= kth[:, None])
                    order = np.lexsort((cells, d[rows, cells], rows))
                    rows, cells = rows[order], cells[order]
                    starts = np.searchsorted(rows, np.arange(hi - lo))
                    found[lo:hi] = cells[starts[:, None] + np.arange(k)[None, :]]
                else:
                    found[lo:hi] = np.argsort(d, axis=1, kind="stable")[:, :k]
        return found


def _octaves(x: np.ndarray) -> np.ndarray:
    """:func:`octave` of every value (by the scalar function, once per distinct value)."""
    uniq = sorted_unique(x)  # (np.unique imports numpy.ma on its first call)
    return np.array([octave(float(v)) for v in uniq.tolist()])[np.searchsorted(uniq, x)]


def _fit_curvature(x: np.ndarray, here: np.ndarray, p_i: np.ndarray, n_i: np.ndarray, y0: np.ndarray,
                   y1: np.ndarray, y: np.ndarray) -> float:
    """The curvature (from CURVATURES) whose blend best predicts the measured latencies ``y``
    at lattice indices ``here`` from their nearest measured neighbours (indices ``p_i`` /
    ``n_i``, latencies ``y0`` / ``y1``) along the axis whose values are ``x`` (module doc)."""
    ok = (y > 0) & np.isfinite(y0) & np.isfinite(y1)
    if not ok.all():
        here, p_i, n_i, y0, y1, y = here[ok], p_i[ok], n_i[ok], y0[ok], y1[ok], y[ok]
    if y.size == 0:
        return 0.0
    if y.size > _FIT_CELLS:  # an even, deterministic subsample bounds the cost
        pick = np.linspace(0, y.size - 1, _FIT_CELLS).astype(np.intp)
        here, p_i, n_i, y0, y1, y = here[pick], p_i[pick], n_i[pick], y0[pick], y1[pick], y[pick]
    a = (y0 - y) / y  # relative error of the lower neighbour ...
    b = (y1 - y0) / y  # ... corrected by the blend weight times this
    # blend weights depend on the (lower, here, upper) lattice indices only
    n = x.size
    triples, inverse = np.unique((p_i * n + here) * n + n_i, return_inverse=True)
    k = np.asarray(CURVATURES)[:, None]
    u = np.where(k >= 0.0, x * (1.0 + k * x), x / (1.0 - k * x))  # (curvatures, lattice values)
    t_p, t_h, t_n = triples // (n * n), (triples // n) % n, triples % n
    w = ((u[:, t_h] - u[:, t_p]) / (u[:, t_n] - u[:, t_p]))[:, inverse]  # (curvatures, cells)
    w *= b
    w += a
    score = np.minimum(np.abs(w, out=w), _FIT_CAP, out=w).mean(axis=1)
    best = int(np.argmin(score))  # first of equals: linear, then the mildest curvature
    return float(CURVATURES[best])


def _pad_top_edge(values: np.ndarray) -> np.ndarray:
    """``np.pad(values, [(0, 1)] * ndim, mode="edge")`` (one more cell at the top of every
    axis, a copy of the last), by slices: the same array, without np.pad's general machinery."""
    shape = values.shape
    out = np.empty(tuple(n + 1 for n in shape), dtype=values.dtype)
    out[tuple(slice(0, n) for n in shape)] = values
    for a, n in enumerate(shape):
        dst = [slice(None)] * len(shape)
        src = [slice(None)] * len(shape)
        dst[a], src[a] = slice(n, n + 1), slice(n - 1, n)
        out[tuple(dst)] = out[tuple(src)]
    return out


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    acc = 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def _along(values: np.ndarray, axis: int, shape: tuple[int, ...]) -> np.ndarray:
    """``values`` (one per index of ``axis``) broadcast to the lattice shape."""
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return np.broadcast_to(values.reshape(view), shape)


def _nanmedian(stack: np.ndarray) -> np.ndarray:
    """Median over the first axis ignoring NaN (an even count: the mean of the two middle
    values); NaN where every entry is NaN (no warning)."""
    count = np.isfinite(stack).sum(axis=0)
    ordered = np.sort(stack, axis=0)  # NaN last
    lo = np.take_along_axis(ordered, np.maximum((count - 1) // 2, 0)[None], axis=0)[0]
    hi = np.take_along_axis(ordered, (count // 2)[None], axis=0)[0]
    return np.where(count > 0, 0.5 * (lo + hi), np.nan)


def _neighbour_values(values: np.ndarray, axis: int, cells: np.ndarray) -> np.ndarray:
    """(neighbours, cells): ``values`` (one per lattice cell) at the cells one step away from
    each of ``cells`` (flat indices) along any of the other axes, sides and diagonals, with
    ``axis`` held; NaN past the edge. Axes of one value do not move."""
    moving = [c for c in range(values.ndim) if c != axis and values.shape[c] > 1]
    if not moving:
        return np.zeros((0, cells.size))
    index = np.unravel_index(cells, values.shape)
    flat = values.ravel()
    strides = _strides(values.shape)
    out = []
    for steps in itertools.product((-1, 0, 1), repeat=len(moving)):
        if not any(steps):
            continue
        ok = np.ones(cells.size, dtype=bool)
        at = cells.copy()
        for c, step in zip(moving, steps):
            if step:
                j = index[c] + step
                ok &= (j >= 0) & (j < values.shape[c])
                at += step * strides[c]
        out.append(np.where(ok, flat[np.where(ok, at, 0)], np.nan))
    return np.stack(out)


def _shifted(values: np.ndarray, axis: int, step: int) -> np.ndarray:
    """``values`` moved by ``step`` (+1 or -1) along ``axis``: out[i] = values[i + step], NaN
    past the edge."""
    out = np.full(values.shape, np.nan)
    src = [slice(None)] * values.ndim
    dst = [slice(None)] * values.ndim
    if step > 0:
        src[axis], dst[axis] = slice(step, None), slice(None, -step)
    else:
        src[axis], dst[axis] = slice(None, step), slice(-step, None)
    out[tuple(dst)] = values[tuple(src)]
    return out


def _neighbours(mask: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """For every cell, the index along ``axis`` of the nearest cell where ``mask`` holds at or
    before it (-1 if none) and at or after it (n if none). Cells where mask holds point to
    themselves."""
    n = mask.shape[axis]
    idx = _along(np.arange(n), axis, mask.shape)
    prev = np.maximum.accumulate(np.where(mask, idx, -1), axis=axis)
    nxt = np.flip(np.minimum.accumulate(np.flip(np.where(mask, idx, n), axis), axis=axis), axis)
    return prev, nxt


def _strict_neighbours(mask: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Like :func:`_neighbours`, but strictly before and strictly after every cell."""
    shape = mask.shape
    n = shape[axis]
    prev_in, next_in = _neighbours(mask, axis)
    prev = np.full(shape, -1, dtype=np.intp)
    nxt = np.full(shape, n, dtype=np.intp)
    lo = [slice(None)] * len(shape)
    hi = [slice(None)] * len(shape)
    lo[axis], hi[axis] = slice(1, None), slice(None, -1)
    prev[tuple(lo)] = prev_in[tuple(hi)]
    nxt[tuple(hi)] = next_in[tuple(lo)]
    return prev, nxt
