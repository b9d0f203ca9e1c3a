"""Grid lookup inside one native group: exact hit, per-axis blend, or roofline extrapolation.

A *grid* is every bucket of a table that shares all key columns but the local head count (and,
for [native][local] families, one native). Its axes are the local heads (``num_heads``) and
the family's interpolation axes (``batch_size``, ``isl``, ``step``; ``num_tokens`` for
``mla_bmm``). The measured points sit on a lattice: the product of every value each axis takes
anywhere in the grid. Measurement grids are ragged (large isl x large batch is often missing,
prefix sweeps differ per isl), so lattice cells come in four states:

``MEASURED``       a stored point (after the loader's duplicate rule).
``INTERPOLATED``   missing, but bracketed along some axis by measured points of its own line:
                   filled by the per-axis blend along the axis whose bracket is narrowest (in
                   octaves), ties broken by axis order.
``EXTRAPOLATED``   not bracketed along any axis: filled from the nearest covered cell along an
                   axis line by holding its roofline utilisation (see :mod:`modperf.roofline`),
                   with its *extrapolation distance* (octaves of value + 1, summed along the
                   path) recorded. Only cells within :data:`EXTRAPOLATION_LIMIT` are filled.
``UNCOVERED``      farther than the limit from any measurement: a query that needs it is refused.

A query is a point; per axis it finds the lattice interval around it and blends the corners
multilinearly, each axis in its own coordinate (:class:`AxisScale`). A query outside an axis's
lattice range is projected onto the edge, answered there, and scaled by the roofline ratio;
the projection adds its own distance. The answer is ``exact`` when the point is a measured cell
(the stored latency is returned bit for bit), ``extrapolated`` when any extrapolation distance
was spent, else ``interpolated``. Past the limit it is refused.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

#: Kind codes of the vectorised API (and their names in answers).
EXACT, INTERPOLATED, EXTRAPOLATED, REFUSED = 0, 1, 2, -1
KIND_NAMES = {EXACT: "exact", INTERPOLATED: "interpolated", EXTRAPOLATED: "extrapolated"}

#: Cell states.
MEASURED_CELL, INTERPOLATED_CELL, EXTRAPOLATED_CELL, UNCOVERED_CELL = 0, 1, 2, 3

#: How far beyond the measurements modperf extrapolates, in octaves of (value + 1) summed over
#: the axes it had to leave: 1.0 allows one doubling of one axis (batch 256 -> 512, isl 16384
#: -> 32768, local heads 128 -> 256), or a half-doubling along two.
EXTRAPOLATION_LIMIT = 1.0


def octave(x: float) -> float:
    """Distance unit for extrapolation: log2(value + 1), so that 0 (an empty prefix) is finite."""
    return math.log2(x + 1.0)


@dataclass(frozen=True)
class AxisScale:
    """The coordinate in which one axis blends: ``lin`` (x), ``sqrt`` (sqrt x) or ``log``
    (log2(x + 1)). Blending is linear in the coordinate and linear in latency."""

    name: str

    def scalar(self) -> Callable[[float], float]:
        if self.name == "sqrt":
            return math.sqrt
        if self.name == "log":
            return octave
        return float

    def array(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if self.name == "sqrt":
            return np.sqrt(x)
        if self.name == "log":
            return np.log2(x + 1.0)
        return x


LIN, SQRT, LOG = AxisScale("lin"), AxisScale("sqrt"), AxisScale("log")

#: Roofline seconds of lattice points: receives axis name -> value array (all the same shape).
Roofline = Callable[[Mapping[str, np.ndarray]], np.ndarray]


@dataclass
class Lookup:
    """One scalar lookup."""

    latency_ms: float
    kind: int
    distance: float  # extrapolation distance spent (octaves); 0 unless extrapolated
    heads_used: tuple[int, ...]  # lattice values of the heads axis that carried weight
    outside: tuple[str, ...]  # axes the point lies beyond the measured range of


class Grid:
    """The measured points of one native group on a lattice, with its fill (see module doc)."""

    def __init__(self, axes: Sequence[str], points: Mapping[str, np.ndarray], latency: np.ndarray,
                 scales: Mapping[str, AxisScale], roofline: Roofline, *, heads_axis: str | None = None,
                 limit: float = EXTRAPOLATION_LIMIT) -> None:
        self.axes = tuple(axes)
        self.heads_axis = heads_axis
        self.limit = float(limit)
        self.roofline = roofline
        self.scales = tuple(scales.get(a, LIN) for a in self.axes)
        self.values = [np.unique(np.asarray(points[a], dtype=np.int64)) for a in self.axes]
        self.shape = tuple(int(v.size) for v in self.values)
        self.coords = [s.array(v) for s, v in zip(self.scales, self.values)]
        self.octaves = [np.log2(v.astype(np.float64) + 1.0) for v in self.values]
        strides = []
        acc = 1
        for n in reversed(self.shape):
            strides.append(acc)
            acc *= n
        self.strides = tuple(reversed(strides))
        index = tuple(np.searchsorted(v, np.asarray(points[a], dtype=np.int64)) for a, v in zip(self.axes, self.values))
        self.n_measured = int(latency.size)
        self._fill(index, np.asarray(latency, dtype=np.float64))
        # plain-Python mirrors for the scalar path (numpy calls cost ~1 us each)
        self._values_py = [v.tolist() for v in self.values]
        self._coords_py = [c.tolist() for c in self.coords]
        self._scale_py = [s.scalar() for s in self.scales]
        self._lat_py = self.latency.ravel().tolist()
        self._state_py = self.state.ravel().tolist()
        self._dist_py = self.distance.ravel().tolist()

    # -- building ------------------------------------------------------------------------

    def _mesh(self) -> dict[str, np.ndarray]:
        grids = np.meshgrid(*[v.astype(np.float64) for v in self.values], indexing="ij")
        return dict(zip(self.axes, grids))

    def _fill(self, index: tuple[np.ndarray, ...], latency: np.ndarray) -> None:
        # masked-out cells divide by zero harmlessly; their results are discarded
        with np.errstate(divide="ignore", invalid="ignore"):
            self._fill_cells(index, latency)

    def _fill_cells(self, index: tuple[np.ndarray, ...], latency: np.ndarray) -> None:
        shape = self.shape
        lat = np.full(shape, np.nan)
        lat[index] = latency
        state = np.full(shape, UNCOVERED_CELL, dtype=np.uint8)
        state[index] = MEASURED_CELL
        dist = np.zeros(shape)
        measured = state == MEASURED_CELL

        # interior cells: bracketed along an axis by measured cells of their own line
        best_span = np.full(shape, np.inf)
        best = np.full(shape, np.nan)
        for a in range(len(shape)):
            if shape[a] < 3:
                continue
            prev, nxt = _neighbours(measured, a)
            ok = ~measured & (prev >= 0) & (nxt < shape[a])
            if not ok.any():
                continue
            c, o = self.coords[a], self.octaves[a]
            here = _along(c, a, shape)
            p_i, n_i = np.where(ok, prev, 0), np.where(ok, nxt, 0)
            c0, c1 = c[p_i], c[n_i]
            w = (here - c0) / (c1 - c0)
            v0 = np.take_along_axis(lat, p_i, a)
            v1 = np.take_along_axis(lat, n_i, a)
            pred = v0 * (1.0 - w) + v1 * w
            span = o[n_i] - o[p_i]
            better = ok & (span < best_span)  # strict: earlier axes win ties
            best_span = np.where(better, span, best_span)
            best = np.where(better, pred, best)
        interior = np.isfinite(best_span)
        lat = np.where(interior, best, lat)
        state[interior] = INTERPOLATED_CELL

        # exterior cells: hold the utilisation of the nearest covered cell along an axis line
        covered = state != UNCOVERED_CELL
        if not covered.all():
            roof = self.roofline(self._mesh())
            roof = np.where(roof > 0, roof, np.nan)
            for _ in range(2 * len(shape) + 2):
                best_d = np.full(shape, np.inf)
                best_v = np.full(shape, np.nan)
                for a in range(len(shape)):
                    if shape[a] < 2:
                        continue
                    o = self.octaves[a]
                    here = _along(o, a, shape)
                    prev, nxt = _neighbours(covered, a)
                    for anchor, valid in ((prev, prev >= 0), (nxt, nxt < shape[a])):
                        ok = ~covered & valid
                        if not ok.any():
                            continue
                        ai = np.where(ok, anchor, 0)
                        d = np.abs(here - o[ai]) + np.take_along_axis(dist, ai, a)
                        v = np.take_along_axis(lat, ai, a) * roof / np.take_along_axis(roof, ai, a)
                        better = ok & (d < best_d) & (d <= self.limit) & np.isfinite(v)
                        best_d = np.where(better, d, best_d)
                        best_v = np.where(better, v, best_v)
                new = np.isfinite(best_d)
                if not new.any():
                    break
                lat = np.where(new, best_v, lat)
                dist = np.where(new, best_d, dist)
                state[new] = EXTRAPOLATED_CELL
                covered |= new
        self.latency, self.state, self.distance = lat, state, dist

    # -- scalar lookup --------------------------------------------------------------------

    def lookup(self, point: Sequence[float]) -> Lookup:
        """Latency at ``point`` (one value per axis, in ``self.axes`` order)."""
        corners: list[tuple[int, float]] = [(0, 1.0)]
        outside: list[str] = []
        proj_dist = 0.0
        projected: list[float] | None = None
        exact = True
        heads_pos = self.axes.index(self.heads_axis) if self.heads_axis in self.axes else -1
        heads_used: tuple[int, ...] = ()
        for a, x in enumerate(point):
            vals = self._values_py[a]
            stride = self.strides[a]
            lo_v, hi_v = vals[0], vals[-1]
            xc = x
            if x < lo_v or x > hi_v:
                xc = lo_v if x < lo_v else hi_v
                proj_dist += abs(octave(x) - octave(xc))
                outside.append(self.axes[a])
                if projected is None:
                    projected = list(point)
                projected[a] = xc
            i = bisect_left(vals, xc)
            if vals[i] == xc:
                corners = [(c + i * stride, w) for c, w in corners]
                if a == heads_pos:
                    heads_used = (vals[i],)
                continue
            exact = False
            coords = self._coords_py[a]
            u = self._scale_py[a](xc)
            t = (u - coords[i - 1]) / (coords[i] - coords[i - 1])
            lo, hi = (i - 1) * stride, i * stride
            corners = [(c + lo, w * (1.0 - t)) for c, w in corners] + [(c + hi, w * t) for c, w in corners]
            if a == heads_pos:
                heads_used = (vals[i - 1], vals[i])
        lat, state, dist = self._lat_py, self._state_py, self._dist_py
        if exact and not outside and state[corners[0][0]] == MEASURED_CELL:
            return Lookup(lat[corners[0][0]], EXACT, 0.0, heads_used, ())
        value = 0.0
        spent = 0.0
        for c, w in corners:
            if w == 0.0:
                continue
            if state[c] == UNCOVERED_CELL:
                return Lookup(math.nan, REFUSED, math.inf, heads_used, tuple(outside))
            value += w * lat[c]
            if dist[c] > spent:
                spent = dist[c]
        spent += proj_dist
        if spent > self.limit:
            return Lookup(math.nan, REFUSED, spent, heads_used, tuple(outside))
        if projected is not None:
            value *= self._roof_ratio(point, projected)
        return Lookup(value, EXTRAPOLATED if spent > 0.0 else INTERPOLATED, spent, heads_used, tuple(outside))

    def _roof_ratio(self, point: Sequence[float], projected: Sequence[float]) -> float:
        at = {a: np.array([float(point[i]), float(projected[i])]) for i, a in enumerate(self.axes)}
        r = self.roofline(at)
        return float(r[0] / r[1]) if r[1] > 0 else math.nan

    # -- vectorised lookup ----------------------------------------------------------------

    def lookup_many(self, points: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Latencies and kind codes for arrays of points (one array per axis, broadcastable).
        Refused points get NaN and kind REFUSED; nothing raises."""
        arrays = np.broadcast_arrays(*[np.asarray(p) for p in points])
        n_shape = arrays[0].shape
        xs = [np.ravel(x).astype(np.float64, copy=False) for x in arrays]
        n = xs[0].size
        flat_lo = np.zeros(n, dtype=np.int64)  # lower corner of the interval on every axis
        flat_at = np.zeros(n, dtype=np.int64)  # the lattice point at or below the query
        parts: list[tuple[int, np.ndarray | None]] = []  # (stride, weight of the upper corner)
        proj = np.zeros(n)
        outside = np.zeros(n, dtype=bool)
        exact = np.ones(n, dtype=bool)
        clipped = []
        for a, x in enumerate(xs):
            vals = self.values[a]
            if vals.size == 1:
                xc = np.full(n, float(vals[0]))
                out = x != xc
                if out.any():
                    proj += np.where(out, np.abs(np.log2(x + 1.0) - np.log2(xc + 1.0)), 0.0)
                    outside |= out
                clipped.append(xc)
                continue
            xc = np.clip(x, vals[0], vals[-1])
            out = xc != x
            if out.any():
                proj += np.where(out, np.abs(np.log2(x + 1.0) - np.log2(xc + 1.0)), 0.0)
                outside |= out
            clipped.append(xc)
            at = np.searchsorted(vals, xc, side="right") - 1  # vals[at] <= xc
            on_value = vals[at] == xc
            exact &= on_value
            flat_at += at * self.strides[a]
            i = np.minimum(at, vals.size - 2)
            c = self.coords[a]
            u = self.scales[a].array(xc)
            t = np.where(on_value & (i == at), 0.0, (u - c[i]) / (c[i + 1] - c[i]))
            flat_lo += i * self.strides[a]
            parts.append((self.strides[a], t))
        with np.errstate(invalid="ignore", divide="ignore"):
            return self._blend_many(xs, clipped, parts, flat_lo, flat_at, exact, proj, outside, n_shape)

    def _blend_many(self, xs, clipped, parts, flat_lo, flat_at, exact, proj, outside, n_shape):  # noqa: ANN001,ANN202
        n = flat_lo.size
        lat_flat, state_flat, dist_flat = self.latency.ravel(), self.state.ravel(), self.distance.ravel()
        value = np.zeros(n)
        spent = np.zeros(n)
        uncovered = np.zeros(n, dtype=bool)
        k = len(parts)
        for corner in range(1 << k):
            idx = flat_lo.copy()
            w = np.ones(n)
            for j, (stride, t) in enumerate(parts):
                if corner >> j & 1:
                    idx += stride
                    w *= t
                else:
                    w *= 1.0 - t
            used = w > 0.0
            st = state_flat[idx]
            uncovered |= used & (st == UNCOVERED_CELL)
            value += np.where(used, w * np.where(used, lat_flat[idx], 0.0), 0.0)
            spent = np.maximum(spent, np.where(used, dist_flat[idx], 0.0))
        spent += proj
        if outside.any():
            sel = np.flatnonzero(outside)
            at = {a: np.concatenate([xs[i][sel], clipped[i][sel]]) for i, a in enumerate(self.axes)}
            r = self.roofline(at)
            value[sel] *= r[: sel.size] / r[sel.size:]
        kind = np.where(spent > 0.0, EXTRAPOLATED, INTERPOLATED).astype(np.int8)
        is_exact = exact & ~outside & (state_flat[flat_at] == MEASURED_CELL)
        kind[is_exact] = EXACT
        value[is_exact] = lat_flat[flat_at[is_exact]]
        refused = uncovered | (spent > self.limit)
        kind[refused] = REFUSED
        value[refused] = np.nan
        return value.reshape(n_shape), kind.reshape(n_shape)

    # -- description ----------------------------------------------------------------------

    def ranges(self) -> dict[str, tuple[int, int]]:
        return {a: (int(v[0]), int(v[-1])) for a, v in zip(self.axes, self.values)}

    def nearest_covered(self, point: Sequence[float], count: int = 3) -> list[dict[str, int]]:
        """The measured lattice points closest to ``point`` (octave distance), for error messages."""
        idx = np.flatnonzero(self.state.ravel() == MEASURED_CELL)
        if idx.size == 0:
            return []
        sub = np.unravel_index(idx, self.shape)
        d = np.zeros(idx.size)
        for a, x in enumerate(point):
            d += np.abs(self.octaves[a][sub[a]] - octave(float(x)))
        best = idx[np.argsort(d, kind="stable")[:count]]
        out = []
        for f in best:
            s = np.unravel_index(int(f), self.shape)
            out.append({a: int(self.values[i][s[i]]) for i, a in enumerate(self.axes)})
        return out


def _along(values: np.ndarray, axis: int, shape: tuple[int, ...]) -> np.ndarray:
    """``values`` (one per index of ``axis``) broadcast to the lattice shape."""
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return np.broadcast_to(values.reshape(view), shape)


def _neighbours(mask: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """For every cell, the index along ``axis`` of the nearest cell where ``mask`` holds at or
    before it (-1 if none) and at or after it (n if none). Cells where mask holds point to
    themselves."""
    n = mask.shape[axis]
    idx = _along(np.arange(n), axis, mask.shape)
    prev = np.maximum.accumulate(np.where(mask, idx, -1), axis=axis)
    nxt = np.flip(np.minimum.accumulate(np.flip(np.where(mask, idx, n), axis), axis=axis), axis)
    return prev, nxt
