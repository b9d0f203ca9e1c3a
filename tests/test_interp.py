"""Grid lookup on small hand-made grids: exact hits, blends, the ragged fill, extrapolation and
its limit, scalar/vector agreement, and properties (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modperf.interp import (
    EXACT,
    EXTRAPOLATED,
    EXTRAPOLATED_CELL,
    INTERPOLATED,
    INTERPOLATED_CELL,
    LIN,
    REFUSED,
    SQRT,
    UNCOVERED_CELL,
    Grid,
)


def work_roofline(values):  # noqa: ANN001,ANN201  (batch, isl): affine in batch, quadratic in isl
    b, s = values
    return b * (s * s + 100.0 * s)


def make(points: dict[tuple[int, int], float], *, curved: str | None = None, scales=None) -> Grid:  # noqa: ANN001
    keys = sorted(points)
    pts = {"batch_size": np.array([k[0] for k in keys]), "isl": np.array([k[1] for k in keys])}
    lat = np.array([points[k] for k in keys])
    return Grid(("batch_size", "isl"), pts, lat, scales or {"batch_size": LIN, "isl": LIN}, work_roofline,
                curved_axis=curved)


FULL = {(b, s): 0.01 * b * s + 0.1 for b in (1, 2, 4, 8) for s in (16, 32, 64, 128)}


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
    # batch 3 between 2 and 4 (t = 0.5), isl 48 between 32 and 64 (t = 0.5)
    expected = 0.25 * (FULL[(2, 32)] + FULL[(2, 64)] + FULL[(4, 32)] + FULL[(4, 64)])
    got = g.lookup([3, 48])
    assert got.kind == INTERPOLATED
    assert got.latency_ms == pytest.approx(expected, rel=1e-12)


def test_sqrt_scale_blends_in_sqrt_space() -> None:
    g = make(FULL, scales={"batch_size": LIN, "isl": SQRT})
    t = (math.sqrt(48) - math.sqrt(32)) / (math.sqrt(64) - math.sqrt(32))
    expected = FULL[(2, 32)] * (1 - t) + FULL[(2, 64)] * t
    assert g.lookup([2, 48]).latency_ms == pytest.approx(expected, rel=1e-12)


def test_curved_axis_blends_in_roofline_time() -> None:
    g = make(FULL, curved="isl")
    r = lambda s: work_roofline((2.0, float(s)))  # noqa: E731
    t = (r(48) - r(32)) / (r(64) - r(32))
    expected = FULL[(2, 32)] * (1 - t) + FULL[(2, 64)] * t
    assert g.lookup([2, 48]).latency_ms == pytest.approx(expected, rel=1e-12)


def test_ragged_hole_filled_along_the_narrowest_roofline_bracket() -> None:
    pts = dict(FULL)
    del pts[(4, 64)]
    g = make(pts)
    cell = (int(np.searchsorted(g.values[0], 4)), int(np.searchsorted(g.values[1], 64)))
    assert g.state[cell] == INTERPOLATED_CELL
    # bracket along batch: 2 -> 8, roofline x4; along isl: 32 -> 128, roofline x6.9: batch wins,
    # blended linearly at t = (4 - 2) / (8 - 2)
    expected = FULL[(2, 64)] * (1 - 1 / 3) + FULL[(8, 64)] * (1 / 3)
    hit = g.lookup([4, 64])
    assert hit.kind == INTERPOLATED
    assert hit.latency_ms == pytest.approx(expected, rel=1e-12)


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


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 8), s=st.integers(16, 128))
def test_scalar_and_vector_paths_agree(b: int, s: int) -> None:
    pts = dict(FULL)
    del pts[(8, 128)]
    g = make(pts, curved="isl")
    one = g.lookup([b, s])
    lat, kind = g.lookup_many([np.array([b]), np.array([s])])
    assert kind[0] == one.kind
    assert lat[0] == pytest.approx(one.latency_ms, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_exact_hit_identity_property(data: st.DataObject) -> None:
    values = data.draw(st.lists(st.floats(1e-4, 1e3, allow_nan=False), min_size=16, max_size=16))
    pts = {k: v for k, v in zip(sorted(FULL), values)}
    g = make(pts, curved="isl")
    key = data.draw(st.sampled_from(sorted(pts)))
    hit = g.lookup(list(key))
    assert hit.kind == EXACT and hit.latency_ms == pts[key]


@settings(max_examples=80, deadline=None)
@given(b0=st.integers(1, 8), b1=st.integers(1, 8), s=st.integers(16, 128))
def test_monotone_data_gives_monotone_answers(b0: int, b1: int, s: int) -> None:
    g = make(FULL, curved="isl")  # latency grows with batch and with isl
    lo, hi = sorted((b0, b1))
    assert g.lookup([lo, s]).latency_ms <= g.lookup([hi, s]).latency_ms
    s2 = min(128, s + 7)
    assert g.lookup([lo, s]).latency_ms <= g.lookup([lo, s2]).latency_ms
