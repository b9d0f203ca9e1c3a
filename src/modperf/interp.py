"""Grid lookup inside one native group: exact hit, per-axis blend, or roofline extrapolation.

A *grid* is every bucket of a table that shares all key columns but the local head count (and,
for [native][local] families, one native). Its axes are the local heads (``num_heads``) and
the family's interpolation axes (``batch_size``, ``isl``, ``step``; ``num_tokens`` for
``mla_bmm``). The measured points sit on a lattice: the product of every value each axis takes
anywhere in the grid. Measurement grids are ragged (large isl x large batch is often missing,
prefix sweeps differ per isl), so lattice cells come in four states:

``MEASURED``       a stored point (after the loader's duplicate rule).
``INTERPOLATED``   missing, but bracketed along some axis by measured points of its own line:
                   filled by the per-axis blend along the axis whose bracket is narrowest in
                   roofline time (the axis along which the least work changes: usually the
                   prefix or cached length, then batch), ties broken by axis order.
``EXTRAPOLATED``   not bracketed along any axis: filled from the nearest covered cell along an
                   axis line by holding its roofline utilisation (see :mod:`modperf.roofline`),
                   with its *extrapolation distance* (octaves of value + 1, summed along the
                   path) recorded. Only cells within :data:`EXTRAPOLATION_LIMIT` are filled.
``UNCOVERED``      farther than the limit from any measurement: a query that needs it is refused.

A query is a point; per axis it finds the lattice interval around it and blends the corners
multilinearly, linear in latency. Each axis blends in its own coordinate: linear for batch,
prefix/cached length and local heads (the work is affine in them), and for the *curved* axis --
the new-token axis of context tables, whose work is linear (projections) plus quadratic
(causal attention) -- in roofline time, so the blend follows the physical crossover; where the
roofline is flat along that axis it falls back to sqrt space. A query outside an axis's
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
from typing import Any

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

#: Below this |log(roofline ratio)| an axis has no roofline shape between two points.
_FLAT = 1e-9


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

#: Roofline seconds: receives one value per axis, in grid axis order (floats, or arrays of one
#: shape), returns a float or an array.
Roofline = Callable[[Sequence[Any]], Any]


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
                 curved_axis: str | None = None, limit: float = EXTRAPOLATION_LIMIT) -> None:
        self.axes = tuple(axes)
        self.curved = self.axes.index(curved_axis) if curved_axis in self.axes else -1
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
        self._roof_py = self.roof.ravel().tolist()
        self.heads_pos = self.axes.index(heads_axis) if heads_axis in self.axes else -1

    # -- building ------------------------------------------------------------------------

    def _mesh(self) -> list[np.ndarray]:
        return np.meshgrid(*[v.astype(np.float64) for v in self.values], indexing="ij")

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

        roof = np.asarray(self.roofline(self._mesh()), dtype=np.float64)
        roof = np.where(roof > 0, roof, np.nan)
        self.roof = roof

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
            r0, r1 = np.take_along_axis(roof, p_i, a), np.take_along_axis(roof, n_i, a)
            span = np.abs(np.log(r1 / r0))
            flat_roof = ~np.isfinite(span) | (span < _FLAT)
            span = np.where(flat_roof, o[n_i] - o[p_i], span)  # no roofline shape: octaves
            if a == self.curved:
                w = np.where(flat_roof, w, (roof - r0) / (r1 - r0))
            v0 = np.take_along_axis(lat, p_i, a)
            v1 = np.take_along_axis(lat, n_i, a)
            pred = v0 * (1.0 - w) + v1 * w
            better = ok & (span < best_span)  # strict: earlier axes win ties
            best_span = np.where(better, span, best_span)
            best = np.where(better, pred, best)
        interior = np.isfinite(best_span)
        lat = np.where(interior, best, lat)
        state[interior] = INTERPOLATED_CELL

        # exterior cells: hold the utilisation of the nearest covered cell along an axis line
        covered = state != UNCOVERED_CELL
        if not covered.all():
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
        n_axes = len(self.axes)
        lo_idx = [0] * n_axes  # lattice index of the lower corner per axis
        frac = [0.0] * n_axes  # weight of the upper corner per axis (0: on a lattice value)
        outside: list[str] = []
        proj_dist = 0.0
        clipped = list(point)
        on_lattice = True
        for a in range(n_axes):
            x = point[a]
            vals = self._values_py[a]
            if x < vals[0] or x > vals[-1]:
                xc = vals[0] if x < vals[0] else vals[-1]
                proj_dist += abs(octave(x) - octave(xc))
                outside.append(self.axes[a])
                clipped[a] = xc
            else:
                xc = x
            i = bisect_left(vals, xc)
            if vals[i] == xc:
                lo_idx[a] = i
                continue
            on_lattice = False
            lo_idx[a] = i - 1
            coords = self._coords_py[a]
            frac[a] = (self._scale_py[a](xc) - coords[i - 1]) / (coords[i] - coords[i - 1])
        strides = self.strides
        base = 0
        for a in range(n_axes):
            base += lo_idx[a] * strides[a]
        lat, state, dist = self._lat_py, self._state_py, self._dist_py
        heads_used: tuple[int, ...] = ()
        if self.heads_pos >= 0:
            h = self.heads_pos
            vals = self._values_py[h]
            heads_used = (vals[lo_idx[h]],) if frac[h] == 0.0 else (vals[lo_idx[h]], vals[lo_idx[h] + 1])
        if on_lattice and not outside and state[base] == MEASURED_CELL:
            return Lookup(lat[base], EXACT, 0.0, heads_used, ())
        c = self.curved
        if c >= 0 and frac[c] != 0.0:
            frac[c] = self._curved_frac(clipped, lo_idx, base, frac[c])
        corners = [(base, 1.0)]
        for a in range(n_axes):
            t = frac[a]
            if t != 0.0:
                step = strides[a]
                corners = [(f, w * (1.0 - t)) for f, w in corners] + [(f + step, w * t) for f, w in corners]
        value = 0.0
        spent = 0.0
        for f, w in corners:
            if w == 0.0:
                continue
            if state[f] == UNCOVERED_CELL:
                return Lookup(math.nan, REFUSED, math.inf, heads_used, tuple(outside))
            value += w * lat[f]
            if dist[f] > spent:
                spent = dist[f]
        spent += proj_dist
        if spent > self.limit:
            return Lookup(math.nan, REFUSED, spent, heads_used, tuple(outside))
        if outside:
            r_at, r_edge = self.roofline(point), self.roofline(clipped)
            value *= r_at / r_edge if r_edge > 0 else math.nan
        return Lookup(value, EXTRAPOLATED if spent > 0.0 else INTERPOLATED, spent, heads_used, tuple(outside))

    def _curved_frac(self, clipped: list[float], lo_idx: list[int], base: int, fallback: float) -> float:
        """Upper-corner weight along the curved axis in roofline time, the other axes held at
        their lower-corner lattice values (the same points the lattice's roofline holds)."""
        c = self.curved
        at = [self._values_py[a][lo_idx[a]] for a in range(len(self.axes))]
        at[c] = clipped[c]
        r0 = self._roof_py[base]
        r1 = self._roof_py[base + self.strides[c]]
        if not (r0 > 0 and r1 > 0) or abs(math.log(r1 / r0)) < _FLAT:
            return fallback
        return (self.roofline(at) - r0) / (r1 - r0)

    # -- vectorised lookup ----------------------------------------------------------------

    def lookup_many(self, points: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Latencies and kind codes for arrays of points (one array per axis, broadcastable).
        Refused points get NaN and kind REFUSED; nothing raises."""
        arrays = np.broadcast_arrays(*[np.asarray(p) for p in points])
        n_shape = arrays[0].shape
        xs = [np.ravel(x).astype(np.float64, copy=False) for x in arrays]
        with np.errstate(invalid="ignore", divide="ignore"):
            value, kind = self._lookup_flat(xs)
        return value.reshape(n_shape), kind.reshape(n_shape)

    def _lookup_flat(self, xs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        n = xs[0].size
        n_axes = len(self.axes)
        base = np.zeros(n, dtype=np.int64)  # lower corner on every axis
        exact = np.ones(n, dtype=bool)
        proj = np.zeros(n)
        outside = np.zeros(n, dtype=bool)
        clipped: list[np.ndarray] = []
        lo_vals: list[np.ndarray] = []
        fracs: list[np.ndarray | None] = []
        for a, x in enumerate(xs):
            vals = self.values[a]
            xc = np.clip(x, vals[0], vals[-1])
            out = xc != x
            if out.any():
                proj += np.where(out, np.abs(np.log2(x + 1.0) - np.log2(xc + 1.0)), 0.0)
                outside |= out
            clipped.append(xc)
            if vals.size == 1:
                lo_vals.append(xc)
                fracs.append(None)
                continue
            at = np.searchsorted(vals, xc, side="right") - 1  # vals[at] <= xc
            on_value = vals[at] == xc
            exact &= on_value
            i = np.minimum(at, vals.size - 2)
            # on a lattice value: sit on it (weight 0 above), also at the top edge
            i = np.where(on_value, at, i)
            top = i == vals.size - 1
            i_lo = np.where(top, i - 1, i)
            c = self.coords[a]
            t = np.where(on_value, np.where(top, 1.0, 0.0),
                         (self.scales[a].array(xc) - c[i_lo]) / (c[i_lo + 1] - c[i_lo]))
            base += i_lo * self.strides[a]
            lo_vals.append(vals[i_lo].astype(np.float64))
            fracs.append(t)
        lat_flat, state_flat, dist_flat = self.latency.ravel(), self.state.ravel(), self.distance.ravel()
        c = self.curved
        if c >= 0 and fracs[c] is not None:
            t = fracs[c]
            off = (t > 0.0) & (t < 1.0)
            if off.any():
                roof_flat = self.roof.ravel()
                r0 = roof_flat[base]
                r1 = roof_flat[np.where(off, base + self.strides[c], base)]
                at = list(lo_vals)
                at[c] = clipped[c]
                rx = np.asarray(self.roofline(at), dtype=np.float64)
                tr = (rx - r0) / (r1 - r0)
                ok = off & (r0 > 0) & (r1 > 0) & (np.abs(np.log(r1 / r0)) >= _FLAT)
                fracs[c] = np.where(ok, tr, t)
        value = np.zeros(n)
        spent = np.zeros(n)
        uncovered = np.zeros(n, dtype=bool)
        # axes on a lattice value for every point (a fixed local count, say) add no corners
        parts = [(self.strides[a], t, 1.0 - t) for a, t in enumerate(fracs) if t is not None and t.any()]
        for corner in range(1 << len(parts)):
            idx = base.copy()
            w = None
            for j, (stride, t, one_minus_t) in enumerate(parts):
                if corner >> j & 1:
                    idx += stride
                    w = t if w is None else w * t
                else:
                    w = one_minus_t if w is None else w * one_minus_t
            if w is None:
                w = np.ones(n)
            used = w > 0.0
            idx[~used] = 0
            uncovered |= used & (state_flat[idx] == UNCOVERED_CELL)
            value += np.where(used, w * lat_flat[idx], 0.0)
            np.maximum(spent, np.where(used, dist_flat[idx], 0.0), out=spent)
        spent += proj
        if outside.any():
            sel = np.flatnonzero(outside)
            r_at = np.asarray(self.roofline([x[sel] for x in xs]), dtype=np.float64)
            r_edge = np.asarray(self.roofline([x[sel] for x in clipped]), dtype=np.float64)
            value[sel] *= r_at / r_edge
        kind = np.where(spent > 0.0, EXTRAPOLATED, INTERPOLATED).astype(np.int8)
        # exact: on lattice values on every axis, inside the range, at a measured cell; the
        # cell is the corner whose weight is 1 (the upper one at a top edge)
        if exact.any():
            at_cell = base.copy()
            for a, t in enumerate(fracs):
                if t is not None:
                    at_cell += np.where(t == 1.0, self.strides[a], 0)
            is_exact = exact & ~outside & (state_flat[at_cell] == MEASURED_CELL)
            kind[is_exact] = EXACT
            value[is_exact] = lat_flat[at_cell[is_exact]]
        refused = uncovered | (spent > self.limit)
        kind[refused] = REFUSED
        value[refused] = np.nan
        return value, kind

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
