"""The scalar lookup on plain lists (modperf.fast.lattice): a lattice restored from a grid's plain
parts answers every point inside the measured range as the grid does, bit for bit, without a
roofline; a point outside is not ``inside`` (the caller leaves it to the grid)."""

from __future__ import annotations

import itertools
import marshal
import math

import numpy as np
import pytest
from tests.test_interp import FULL, make

from modperf.fast.lattice import EXACT, EXTRAPOLATED, INTERPOLATED, REFUSED, Lattice, Lookup


def ragged() -> dict[tuple[int, int], float]:
    """FULL with its large-batch, long-isl corner missing (filled by extrapolation) and a hole."""
    points = {k: v for k, v in FULL.items() if not (k[0] >= 4 and k[1] >= 64)}
    points.pop((2, 32))
    return points


@pytest.mark.parametrize("points", [FULL, ragged()], ids=["full", "ragged"])
def test_a_restored_lattice_answers_as_its_grid_bit_for_bit(points: dict[tuple[int, int], float]) -> None:
    grid = make(points)
    restored = Lattice.from_plain(marshal.loads(marshal.dumps(grid.plain_parts())))
    assert restored.roofline is None
    kinds = set()
    for b, s in itertools.product(range(1, 9), range(16, 129, 7)):
        assert restored.inside([b, s])
        got, want = restored.lookup([b, s]), grid.lookup([b, s])
        assert type(got) is Lookup and got == want
        assert math.isnan(got.latency_ms) or got.latency_ms.hex() == want.latency_ms.hex()
        kinds.add(got.kind)
    assert {EXACT, INTERPOLATED} <= kinds
    if points is not FULL:
        assert EXTRAPOLATED in kinds  # the filled corner, inside the measured range
    assert restored.ranges() == grid.ranges() == {"batch_size": (1, 8), "isl": (16, 128)}


def test_a_point_past_the_measured_range_is_not_inside() -> None:
    grid = make(FULL)
    restored = Lattice.from_plain(grid.plain_parts())
    assert not restored.inside([16, 64]) and not restored.inside([4, 8])
    assert grid.lookup([16, 64]).kind == EXTRAPOLATED  # the grid projects it with its roofline


def test_parts_that_do_not_fit_together_are_refused() -> None:
    parts = list(make(FULL).plain_parts())
    parts[Lattice.PLAIN.index("lat_py")] = parts[Lattice.PLAIN.index("lat_py")][:-1]
    with pytest.raises(ValueError, match="lattice parts do not fit together"):
        Lattice.from_plain(parts)
    with pytest.raises(ValueError, match="lattice parts do not fit together"):
        Lattice.from_plain(parts[:3])


def test_lookup_compares_by_value() -> None:
    a = Lookup(1.5, INTERPOLATED, 0.0, (4,), ())
    assert a == Lookup(1.5, INTERPOLATED, 0.0, (4,), ()) and a != Lookup(1.5, REFUSED, 0.0, (4,), ())
    assert repr(a) == "Lookup(latency_ms=1.5, kind=1, distance=0.0, heads_used=(4,), outside=())"
    assert np.isnan(Lookup(math.nan, REFUSED, math.inf, (), ()).latency_ms)
