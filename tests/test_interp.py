"""Grid lookup on small hand-made grids: exact hits, blends in the fitted axis coordinate, the
ragged fill (axis estimates combined by their expected errors), extrapolation and its limit,
scalar/vector agreement, and properties (hypothesis)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modperf.query import interp
from modperf.query.interp import (
    CURVATURES,
    EXACT,
    EXTRAPOLATED,
    EXTRAPOLATED_CELL,
    INTERPOLATED,
    INTERPOLATED_CELL,
    REFUSED,
    UNCOVERED_CELL,
    Grid,
    curve,
)

BATCH = (1, 2, 4, 8)
ISL = (16, 32, 64, 128)


def work_roofline(values):
    b, s = values
    return b * (s * s + 100.0 * s)


def make(points: dict[tuple[int, int], float]) -> Grid:
    keys = sorted(points)
    pts = {"batch_size": np.array([k[0] for k in keys]), "isl": np.array([k[1] for k in keys])}
    lat = np.array([points[k] for k in keys])
    return Grid(("batch_size", "isl"), pts, lat, work_roofline)


FULL = {(b, s): 0.01 * b * s + 0.1 for b in BATCH for s in ISL}


def test_exact_hit_returns_the_stored_value_bit_for_bit() -> None:
    stored = 0.1 + 0.2  # not representable as typed: identity, not arithmetic, must return it
    g = make({**FULL, (2, 32): stored})
    hit = g.lookup([2, 32])
    assert hit.kind == EXACT and hit.latency_ms == stored and hit.distance == 0.0
    lat, kind = g.lookup_many([np.array([2, 8]), np.array([32, 128])])
    assert lat[0] == stored and lat[1] == FULL[(8, 128)]
    assert kind.tolist() == [EXACT, EXACT]


def test_linear_blend_between_neighbours() -> None:
    g = make(FULL)
    assert g.curvature == [0.0, 0.0]  # bilinear data: the linear coordinate predicts it exactly
    # batch 3 between 2 and 4 (t = 0.5), isl 48 between 32 and 64 (t = 0.5)
    expected = 0.25 * (FULL[(2, 32)] + FULL[(2, 64)] + FULL[(4, 32)] + FULL[(4, 64)])
    got = g.lookup([3, 48])
    assert got.kind == INTERPOLATED
    assert got.latency_ms == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("k", [4.0 ** -4, -(4.0 ** -3)])
def test_axis_coordinate_is_the_curvature_that_predicts_the_grid_best(k: float) -> None:
    # latency affine in u(isl) of curvature k (convex: linear + quadratic; concave: saturating)
    # and linear in batch: leave-one-out along isl is exact for that k only
    isl = (16, 32, 64, 128, 256)
    truth = {(b, s): b * (0.05 + 0.01 * curve(float(s), k)) for b in BATCH for s in isl}
    g = make(truth)
    assert k in CURVATURES and g.curvature == [0.0, k]
    # a query between lattice values blends in that coordinate: t = (u(48) - u(32)) / (u(64) - u(32))
    t = (curve(48.0, k) - curve(32.0, k)) / (curve(64.0, k) - curve(32.0, k))
    expected = truth[(2, 32)] + t * (truth[(2, 64)] - truth[(2, 32)])
    got = g.lookup([2, 48])
    assert got.kind == INTERPOLATED
    assert got.latency_ms == pytest.approx(expected, rel=1e-12)
    assert got.latency_ms == pytest.approx(2 * (0.05 + 0.01 * curve(48.0, k)), rel=1e-12)


def _line(points: dict[tuple[int, ...], float], cell: tuple[int, ...], axis: int) -> tuple[tuple, tuple]:
    """The nearest measured cells strictly below and above ``cell`` along ``axis`` (or None)."""
    line = sorted(p for p in points if all(p[c] == cell[c] for c in range(len(cell)) if c != axis))
    below = [p for p in line if p[axis] < cell[axis]]
    above = [p for p in line if p[axis] > cell[axis]]
    return (below[-1] if below else None), (above[0] if above else None)


def _blend(points: dict, cell: tuple[int, ...], axis: int, k: float) -> float | None:
    lo, hi = _line(points, cell, axis)
    if lo is None or hi is None:
        return None
    u = lambda p: curve(float(p[axis]), k)  # noqa: E731
    return points[lo] + (u(cell) - u(lo)) / (u(hi) - u(lo)) * (points[hi] - points[lo])


def _loo(points: dict, cell: tuple[int, ...] | None, axis: int, k: float) -> float | None:
    """Leave-one-out error of the axis blend at a measured cell (its own nearest neighbours)."""
    if cell is None or cell not in points:
        return None
    est = _blend(points, cell, axis, k)
    return None if est is None else abs(est / points[cell] - 1.0)


def _median(values: list[float | None]) -> float | None:
    kept = sorted(v for v in values if v is not None)
    if not kept:
        return None
    return 0.5 * (kept[(len(kept) - 1) // 2] + kept[len(kept) // 2])


def _hand_fill(points: dict, lattice: tuple[tuple[int, ...], ...], hole: tuple[int, ...],
               curvature: list[float]) -> float:
    """The documented fill of a missing cell, by hand: every axis that brackets it gives its
    blend, weighted by ``(e^2 + 0.005^2)^-2``, ``e`` the median of the blend's leave-one-out
    errors at the two bracket ends and at the cells one step away along the other axes (sides
    and diagonals), and at least the smaller of the two ends' errors where both have one."""
    num = den = 0.0
    for axis in range(len(hole)):
        k = curvature[axis]
        est = _blend(points, hole, axis, k)
        if est is None:
            continue
        lo, hi = _line(points, hole, axis)
        ends = [_loo(points, lo, axis, k), _loo(points, hi, axis, k)]
        evidence = list(ends)
        others = [c for c in range(len(hole)) if c != axis and len(lattice[c]) > 1]
        for steps in itertools.product((-1, 0, 1), repeat=len(others)):
            if not any(steps):
                continue
            cell = list(hole)
            for c, step in zip(others, steps):
                j = lattice[c].index(hole[c]) + step
                cell[c] = lattice[c][j] if 0 <= j < len(lattice[c]) else None
            evidence.append(None if None in cell else _loo(points, tuple(cell), axis, k))
        err = _median(evidence)
        if None not in ends:
            err = max(err, min(ends))
        err = 1.0 if err is None else err
        w = (err * err + 0.005 ** 2) ** -2
        num, den = num + w * est, den + w
    return num / den


def test_ragged_hole_combines_the_axis_estimates_weighted_by_their_errors_nearby() -> None:
    # uneven data (each axis's blend has its own errors), and a hole at (4, 64)
    pts = {(b, s): 0.01 * b * s + 0.1 + 0.002 * ((7 * b + 3 * s) % 5) for b in BATCH for s in ISL}
    del pts[(4, 64)]
    g = make(pts)
    hole = (4, 64)
    assert g.state[BATCH.index(4), ISL.index(64)] == INTERPOLATED_CELL
    hit = g.lookup(list(hole))
    assert hit.kind == INTERPOLATED
    assert hit.latency_ms == pytest.approx(_hand_fill(pts, (BATCH, ISL), hole, g.curvature), rel=1e-12)
    # the two axes disagree, and the answer lies between them
    along = sorted(_blend(pts, hole, a, g.curvature[a]) for a in (0, 1))
    assert along[0] < hit.latency_ms < along[1]


def test_hole_evidence_includes_the_diagonal_neighbours_in_three_axes() -> None:
    heads, batch, isl = (8, 16, 32, 64), BATCH, ISL
    pts = {(h, b, s): 0.001 * h * b * s ** 1.2 + 0.05 + 0.003 * ((5 * h + 7 * b + 3 * s) % 7)
           for h in heads for b in batch for s in isl}
    hole = (16, 4, 64)
    del pts[hole]
    keys = sorted(pts)
    g = Grid(("num_heads", "batch_size", "isl"), {a: np.array([k[i] for k in keys]) for i, a in
                                                   enumerate(("num_heads", "batch_size", "isl"))},
             np.array([pts[k] for k in keys]), lambda v: v[0] * v[1] * v[2] * v[2], heads_axis="num_heads")
    hit = g.lookup(list(hole))
    assert hit.kind == INTERPOLATED
    assert hit.latency_ms == pytest.approx(_hand_fill(pts, (heads, batch, isl), hole, g.curvature), rel=1e-12)


def test_one_outlier_nearby_does_not_decide_the_weights() -> None:
    # linear in batch, a kink along isl (its blend across the hole is far off), and one spike
    # (+30 %) at (4, 128): one line over from the hole along isl, so it is among the evidence
    # of the batch blend. Four values of evidence, one of them the spike: their median says
    # the batch blend is exact here (it is), and the answer is the batch blend.
    kink = {16: 16.0, 32: 32.0, 64: 64.0, 128: 400.0}
    pts = {(b, s): 0.01 * b * kink[s] + 0.1 for b in BATCH for s in ISL}
    hole = (4, 64)
    truth = pts.pop(hole)
    pts[(4, 128)] *= 1.3
    g = make(pts)
    assert g.curvature[0] == 0.0
    assert _blend(pts, hole, 0, 0.0) == pytest.approx(truth, rel=1e-12)  # along batch: exact
    assert abs(_blend(pts, hole, 1, g.curvature[1]) / truth - 1.0) > 0.5  # along isl: far off
    assert _loo(pts, (4, 128), 0, 0.0) > 0.2  # the spike, seen by the batch blend
    got = g.lookup(list(hole)).latency_ms
    assert got == pytest.approx(_hand_fill(pts, (BATCH, ISL), hole, g.curvature), rel=1e-12)
    assert got == pytest.approx(truth, rel=1e-4)


def test_a_blend_through_a_spike_gets_no_trust() -> None:
    # a gross outlier (x25) bracketing the hole along isl: both bracket ends are then off their
    # own line (each is predicted through the other), so the isl blend's error is at least
    # that, however well the same blend does one line over; the batch blend answers
    isl = (16, 32, 64, 128, 256)
    pts = {(b, s): 0.01 * b * s + 0.1 for b in BATCH for s in isl}
    hole = (4, 64)
    truth = pts.pop(hole)
    pts[(4, 32)] *= 25.0
    g = make(pts)
    k = g.curvature[1]
    assert _blend(pts, hole, 1, k) / truth > 3.0  # along isl, through the spike
    ends = [_loo(pts, (4, 32), 1, k), _loo(pts, (4, 128), 1, k)]
    assert None not in ends and min(ends) > 0.5
    got = g.lookup(list(hole)).latency_ms
    assert got == pytest.approx(_hand_fill(pts, (BATCH, isl), hole, g.curvature), rel=1e-12)
    assert got == pytest.approx(truth, rel=1e-3)


def test_missing_corner_is_extrapolated_by_roofline_and_labelled() -> None:
    pts = dict(FULL)
    del pts[(8, 128)]
    g = make(pts)
    cell = (3, 3)
    assert g.state[cell] == EXTRAPOLATED_CELL
    hit = g.lookup([8, 128])
    assert hit.kind == EXTRAPOLATED
    # anchors along the lines: (4, 128) is log2(9/5) = 0.85 octaves away, (8, 64) log2(129/65)
    # = 0.99: the nearer one answers, scaled by the roofline ratio (x2 in batch)
    anchor = FULL[(4, 128)] * work_roofline((8.0, 128.0)) / work_roofline((4.0, 128.0))
    assert hit.latency_ms == pytest.approx(anchor, rel=1e-12)
    assert hit.distance == pytest.approx(math.log2(9 / 5), rel=1e-12)


def test_beyond_the_range_scales_by_roofline_until_the_limit() -> None:
    g = make(FULL)
    near = g.lookup([12, 64])  # batch 8 -> 12: log2(13/9) octaves past the edge
    assert near.kind == EXTRAPOLATED and near.outside == ("batch_size",)
    assert near.latency_ms == pytest.approx(FULL[(8, 64)] * 12 / 8, rel=1e-12)
    assert near.distance == pytest.approx(math.log2(13 / 9), rel=1e-12)
    far = g.lookup([64, 64])  # three doublings: refused, never clamped
    assert far.kind == REFUSED and math.isnan(far.latency_ms)


def test_far_ragged_region_is_uncovered() -> None:
    pts = {(b, s): v for (b, s), v in FULL.items() if b * s <= 128}
    g = make(pts)
    assert g.state[3, 3] == UNCOVERED_CELL
    assert g.lookup([8, 128]).kind == REFUSED


def _quadratic_grid() -> tuple[Grid, dict]:
    """Convex in isl (a fitted curvature), a missing corner (extrapolated cells), uncovered far."""
    pts = {(b, s): b * (0.05 + 0.01 * s + s * s / 2e4) for b in BATCH for s in ISL}
    del pts[(8, 128)]
    return make(pts), pts


@settings(max_examples=80, deadline=None)
@given(b=st.integers(0, 24), s=st.integers(8, 300))
def test_scalar_and_vector_paths_agree_bit_for_bit(b: int, s: int) -> None:
    g, _ = _quadratic_grid()
    one = g.lookup([b, s])
    lat, kind = g.lookup_many([np.array([b, 1]), np.array([s, 16])])
    assert kind[0] == one.kind
    assert lat[0] == one.latency_ms or (math.isnan(lat[0]) and math.isnan(one.latency_ms))
    # a scalar column (one value for every point) takes the same path
    lat2, kind2 = g.lookup_many([b, np.array([s, s])])
    assert kind2.tolist() == [one.kind] * 2
    assert lat2[0] == one.latency_ms or (math.isnan(lat2[0]) and math.isnan(one.latency_ms))


def test_large_vectorised_calls_are_chunked_without_changing_answers() -> None:
    g, _ = _quadratic_grid()
    rng = np.random.default_rng(3)
    n = 3 * interp._CHUNK + 17
    b, s = rng.integers(0, 20, n), rng.integers(8, 260, n)
    lat, kind = g.lookup_many([b, s])
    for j in rng.choice(n, 300, replace=False):
        one = g.lookup([int(b[j]), int(s[j])])
        assert kind[j] == one.kind
        assert lat[j] == one.latency_ms or (math.isnan(lat[j]) and math.isnan(one.latency_ms))
    assert set(kind.tolist()) == {EXACT, INTERPOLATED, EXTRAPOLATED, REFUSED}


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_exact_hit_identity_property(data: st.DataObject) -> None:
    values = data.draw(st.lists(st.floats(1e-4, 1e3, allow_nan=False), min_size=16, max_size=16))
    pts = {k: v for k, v in zip(sorted(FULL), values)}
    g = make(pts)
    key = data.draw(st.sampled_from(sorted(pts)))
    hit = g.lookup(list(key))
    assert hit.kind == EXACT and hit.latency_ms == pts[key]
    lat, kind = g.lookup_many([np.array([key[0]]), np.array([key[1]])])
    assert kind[0] == EXACT and lat[0] == pts[key]


@settings(max_examples=80, deadline=None)
@given(b0=st.integers(1, 8), b1=st.integers(1, 8), s=st.integers(16, 128))
def test_monotone_data_gives_monotone_answers(b0: int, b1: int, s: int) -> None:
    g, _ = _quadratic_grid()  # latency grows with batch and with isl
    lo, hi = sorted((b0, b1))
    assert g.lookup([lo, s]).latency_ms <= g.lookup([hi, s]).latency_ms
    s2 = min(128, s + 7)
    assert g.lookup([lo, s]).latency_ms <= g.lookup([lo, s2]).latency_ms


def test_exact_fast_path_answers_as_the_general_path(db) -> None:
    """Every lattice cell of a real grid (measured, interpolated, extrapolated, uncovered): the
    scalar lookup (with its exact-hit fast path) returns what the general path returns."""
    grid = db.queries.grid({"table": "mla_context_module", "system": "h200_sxm", "backend": "trtllm",
                            "version": "1.3.0rc20", "model": "deepseek-ai/DeepSeek-V3", "tp_size": 8})
    exact = 0
    for cell in itertools.product(*[v.tolist() for v in grid.values]):
        fast, general = grid.lookup(cell), grid.lookup_general(cell)
        assert (fast.kind, fast.distance, fast.heads_used, fast.outside) == \
            (general.kind, general.distance, general.heads_used, general.outside)
        assert math.isnan(fast.latency_ms) if math.isnan(general.latency_ms) else \
            fast.latency_ms.hex() == general.latency_ms.hex()
        exact += fast.kind == EXACT
        assert type(fast.latency_ms) is float
    assert exact == grid.n_measured
    # a float coordinate equal to a lattice value is that value (as the general path treats it)
    cell = tuple(float(v[0]) for v in grid.values)
    assert grid.lookup(cell) == grid.lookup_general(cell)


@given(st.lists(st.integers(-2**40, 2**40), max_size=40))
def test_sorted_unique_is_np_unique(values: list[int]) -> None:
    arr = np.asarray(values, dtype=np.int64)
    got = interp.sorted_unique(arr)
    assert got.dtype == np.unique(arr).dtype and got.tolist() == np.unique(arr).tolist()


def test_many_points_find_the_nearest_measured_cells_and_distances_of_the_scalar_search(db) -> None:
    """Random points of a real ragged grid, inside and beyond its range (a scalar axis, as a
    batch's fixed heads, beside array axes): the vectorised search lists the scalar search's
    nearest measured cells in its order, and the lookup spends the scalar lookup's distance
    (finite or not) on every point."""
    grid = db.queries.grid({"table": "mla_context_module", "system": "h200_sxm", "backend": "trtllm",
                            "version": "1.3.0rc20", "model": "deepseek-ai/DeepSeek-V3", "tp_size": 8})
    rng = np.random.default_rng(11)
    n = 600
    cols: list[np.ndarray | int] = []
    for a, values in enumerate(grid.values):
        lo, hi = int(values[0]), int(values[-1])
        cols.append(int(values[len(values) // 2]) if a == grid.heads_pos else rng.integers(lo, 3 * hi + 2, n))
    cells = grid.nearest_covered_many(cols)
    value, kind, spent = grid.lookup_many_spent(cols)
    assert cells.shape == (n, 3, len(grid.axes)) and cells.dtype == np.int64
    finite = 0
    for j in range(n):
        point = [c if isinstance(c, int) else int(c[j]) for c in cols]
        assert [dict(zip(grid.axes, c)) for c in cells[j].tolist()] == grid.nearest_covered(point)
        one = grid.lookup(point)
        assert kind[j] == one.kind
        if one.kind == REFUSED:
            assert math.isfinite(spent[j]) == math.isfinite(one.distance)
            finite += math.isfinite(one.distance)
        else:
            assert spent[j] == one.distance  # bit for bit (an extrapolated answer writes it)
            assert value[j] == one.latency_ms
    refused = int((kind == REFUSED).sum())
    assert 0 < finite < refused  # both kinds of refusal: beyond the limit, and no measurement near
    # fewer measured cells than asked for: every one, in the scalar search's order
    small = make({(1, 16): 1.0, (2, 32): 2.0})
    got = small.nearest_covered_many([np.array([1, 8, 3]), 64])
    assert got.shape == (3, 2, 2)
    for j, b in enumerate((1, 8, 3)):
        assert [dict(zip(small.axes, c)) for c in got[j].tolist()] == small.nearest_covered([b, 64])


def _real_grids(db) -> list[Grid]:
    """Grids of real tables: a [native][local] module (one axis blended at a time off the
    lattice), a local-only GQA table, and a DSV4 module (heads 8 and 16 measured, so that a
    point between them blends two axes or more)."""
    asks = [
        {"table": "mla_context_module", "system": "h200_sxm", "backend": "trtllm", "version": "1.3.0rc20",
         "model": "deepseek-ai/DeepSeek-V3", "tp_size": 8},
        {"table": "context_attention", "system": "h200_sxm", "backend": "sglang", "version": "0.5.14",
         "kernel_source": "triton", "attn_dtype": "bfloat16", "kv_cache_dtype": "fp8", "num_key_value_heads": 1,
         "head_dim": 256, "window_size": 1024, "beam_width": 1},
        {"table": "dsv4_csa_generation_module", "system": "h200_sxm", "backend": "sglang", "version": "0.5.14",
         "native_heads": 64, "kernel_source": "compressed_flashmla", "mla_dtype": "bfloat16",
         "kv_cache_dtype": "fp8_e4m3", "gemm_type": "bfloat16", "compress_ratio": 4},
    ]
    return [db.queries.grid(a) for a in asks]


def _probe_points(grid: Grid, rng: np.random.Generator, n: int) -> list[list[int]]:
    """Points of ``grid``: per axis a lattice value, a value between two, one just past either
    end or twice past the top (exact, interpolated along one or more axes, extrapolated,
    refused beyond the limit or where no measurement reaches)."""
    out = []
    for _ in range(n):
        point = []
        for vals in grid._values_py:
            pick = rng.integers(6)
            i = int(rng.integers(len(vals)))
            if pick < 3 or len(vals) == 1:
                x = vals[i]
            elif pick == 3:
                j = min(i + 1, len(vals) - 1)
                x = (vals[i] + vals[j]) // 2
            elif pick == 4:
                x = max(vals[0] - 1, 0) if rng.integers(2) else vals[-1] + 1
            else:
                x = 2 * vals[-1] + 3
            point.append(int(x))
        out.append(point)
    return out


def test_offsets_of_lattice_values_find_each_cell_as_the_lookup_does(db) -> None:
    """Every lattice cell of real grids: the sum of its values' offsets is the cell the lookup
    reads (a measured cell's stored latency, bit for bit); a value off the lattice keeps the
    sum negative."""
    for grid in _real_grids(db):
        measured = 0
        for cell in itertools.product(*grid._values_py):
            at = sum(offsets[x] for offsets, x in zip(grid.offsets_py, cell))
            found = grid.lookup_general(list(cell))
            if found.kind == EXACT:
                measured += 1
                assert grid.state_py[at] == interp.MEASURED_CELL
                assert grid.lat_py[at].hex() == found.latency_ms.hex()
                assert grid.support(list(cell)) == [dict(zip(grid.axes, cell))]
            else:
                assert grid.state_py[at] != interp.MEASURED_CELL
        assert measured == grid.n_measured > 0
        off = [grid._values_py[0][0] + 1 if grid._values_py[0][0] + 1 not in grid.offsets_py[0] else -1]
        assert sum([grid.offsets_py[0].get(off[0], interp.MISSING_OFFSET),
                    *[max(o.values()) for o in grid.offsets_py[1:]]]) < 0


def test_scalar_lookup_of_real_grids_is_the_vectorised_lookup_bit_for_bit(db) -> None:
    """The scalar lookup (one or two blended axes unrolled, the rest general) against the
    vectorised path, on points of every kind: the latency bit for bit, the kind, the distance;
    the measured cells an answer stands on are measured corners of its interpolation box."""
    rng = np.random.default_rng(5)
    seen: set[int] = set()
    blended: set[int] = set()
    for grid in _real_grids(db):
        points = _probe_points(grid, rng, 1500)
        cols = [np.array(c) for c in zip(*points)]
        lat, kind, spent = grid.lookup_many_spent(cols)
        for j, point in enumerate(points):
            one = grid.lookup(point)
            assert (one.kind, math.isnan(one.latency_ms)) == (kind[j], math.isnan(lat[j])), point
            if one.kind != REFUSED:
                assert one.latency_ms.hex() == float(lat[j]).hex(), point
                assert one.distance == spent[j] or round(one.distance, 6) == round(float(spent[j]), 6)
            # each point alone (every axis one value for all points: the scalar's own operations)
            alone = grid.lookup_many([np.array([x]) for x in point])
            assert alone[1][0] == one.kind and (one.kind == REFUSED or alone[0][0].hex() == one.latency_ms.hex())
            for cell in grid.support_values(point):
                at = sum(offsets[x] for offsets, x in zip(grid.offsets_py, cell))
                assert grid.state_py[at] == interp.MEASURED_CELL
            seen.add(one.kind)
            blended.add(sum(x not in grid._index_py[a] for a, x in enumerate(point)))
    assert seen == {EXACT, INTERPOLATED, EXTRAPOLATED, REFUSED}
    assert {0, 1, 2, 3} <= blended


def test_two_blended_axes_spend_the_distance_of_the_corners_that_carry_weight() -> None:
    """A grid missing a corner cell (then extrapolated, or interpolated, or uncovered): every
    point between lattice values on both axes, and on one, spends what the vectorised path
    spends (the largest distance over the corners with weight) and gets its latency."""
    checked = 0
    for hole in itertools.product(BATCH, ISL):
        for second in (None, (BATCH[-1], ISL[0])):
            g = make({k: v for k, v in FULL.items() if k != hole and k != second})
            bs = sorted({*BATCH, *[(a + b) // 2 for a, b in itertools.pairwise(BATCH)]})
            ss = sorted({*ISL, *[(a + b) // 2 for a, b in itertools.pairwise(ISL)], 20, 60})
            points = list(itertools.product(bs, ss))
            lat, kind, spent = g.lookup_many_spent([np.array([p[0] for p in points]), np.array([p[1] for p in points])])
            for j, (b, s) in enumerate(points):
                one = g.lookup([b, s])
                assert one.kind == kind[j] and one.distance == spent[j], (hole, b, s)
                if one.kind != REFUSED:
                    assert one.latency_ms.hex() == float(lat[j]).hex()
                checked += one.kind == EXTRAPOLATED
    assert checked > 0


@pytest.mark.parametrize("slot", [("h200_sxm", "trtllm", "1.3.0rc20", "mla_context_module"),
                                  ("h200_sxm", "trtllm", "1.3.0rc20", "mla_generation_module"),
                                  ("h200_sxm", "sglang", "0.5.14", "context_attention"),
                                  ("h200_sxm", "sglang", "0.5.14", "generation_attention"),
                                  ("h200_sxm", "trtllm", "1.3.0rc20", "gemm")])
def test_the_search_by_blocks_finds_the_cells_of_the_dense_and_the_scalar_search(db, slot) -> None:
    """The nearest measured cells by blocks (far blocks skipped) against every cell's distance
    and against the scalar search, for many points of real grids: on lattice values and
    between them (many equal distances, so the tie rule shows), inside the range and far
    beyond it, with the heads given per point and as one value; 1, 3 and 7 cells."""
    from tests.helpers import point_fields

    keyed = db.table(*slot)
    rng = np.random.default_rng(23)
    searched = 0
    for b in range(min(keyed.n_buckets, 3)):
        grid = db.queries.grid(point_fields(keyed, b, int(keyed.offsets[b])))
        n = 1500 if grid.n_measured < 4000 else 150  # (the dense search of gemm's 35,700 cells is slow)
        cols: list[np.ndarray | int] = []
        for values in grid.values:
            lo, hi = int(values[0]), int(values[-1])
            on = rng.choice(values, n)
            between = (rng.choice(values, n) + rng.choice(values, n)) // 2
            far = rng.integers(max(0, lo // 4), 4 * hi + 2, n)
            cols.append(np.where(rng.random(n) < 0.4, on, np.where(rng.random(n) < 0.5, between, far)))
        variants = [cols]
        if grid.heads_pos is not None:
            variants.append([int(grid.values[a][0]) if a == grid.heads_pos else c for a, c in enumerate(cols)])
        for points in variants:
            for count in (1, 3, 7):
                k = min(count, grid.n_measured)
                if grid._nearest_blocks(k) is None:
                    continue
                searched += 1
                got = grid.nearest_covered_many(points, count)
                dense = grid._nearest_dense(points, n, k)
                idx, _ = grid._measured_octaves()
                sub = np.unravel_index(idx[dense], grid.shape)
                assert got.tolist() == np.stack([grid.values[a][sub[a]] for a in range(len(grid.axes))], -1).tolist()
                for j in rng.choice(n, 50, replace=False).tolist():
                    point = [c if isinstance(c, int) else int(c[j]) for c in points]
                    assert [dict(zip(grid.axes, c)) for c in got[j].tolist()] == grid.nearest_covered(point, count)
    assert searched >= 3


def test_the_search_by_blocks_on_a_grid_of_one_block() -> None:
    grid = make({(1, b): float(b) for b in range(1, 200, 3)})
    assert grid._nearest_blocks(3) is not None
    points = [1, np.arange(0, 700, 7)]
    got = grid.nearest_covered_many(points)
    for j, b in enumerate(range(0, 700, 7)):
        assert [dict(zip(grid.axes, c)) for c in got[j].tolist()] == grid.nearest_covered([1, b])


@pytest.mark.parametrize("shape", [(1,), (5,), (3, 1), (2, 4), (4, 1, 3), (2, 3, 1, 5)])
def test_top_edge_padding_is_numpys_edge_pad(shape: tuple[int, ...]) -> None:
    values = np.arange(math.prod(shape), dtype=np.float64).reshape(shape) * 1.5
    values.ravel()[::3] = np.nan
    want = np.pad(values, [(0, 1)] * len(shape), mode="edge")
    got = interp._pad_top_edge(values)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    state = (np.arange(math.prod(shape)) % 4).astype(np.uint8).reshape(shape)
    assert interp._pad_top_edge(state).tobytes() == np.pad(state, [(0, 1)] * len(shape), mode="edge").tobytes()


def test_a_grid_restored_from_its_fill_parts_answers_bit_for_bit() -> None:
    grid, _ = _quadratic_grid()
    parts = {k: v.copy() for k, v in grid.fill_parts().items()}
    again = Grid.restore(grid.axes, parts, grid.roofline, heads_axis=grid.heads_axis, limit=grid.limit)
    assert again.curvature == grid.curvature and again.shape == grid.shape
    for b in range(0, 80, 3):
        for s in range(0, 9000, 700):
            x, y = grid.lookup((b, s)), again.lookup((b, s))
            assert (x.kind, x.distance, math.isnan(x.latency_ms) or x.latency_ms.hex()) == \
                (y.kind, y.distance, math.isnan(y.latency_ms) or y.latency_ms.hex())
    parts["latency"] = parts["latency"][:1]
    with pytest.raises(ValueError, match="do not fit"):
        Grid.restore(grid.axes, parts, grid.roofline)
