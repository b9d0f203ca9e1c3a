"""The serving constants the backends carry are a refit on the calibration rows (modperf.serving.fit):
the calibration half of the corpus's silicon_sample.csv priced from the op tables, fitted as
``bench/silicon.py --fit`` fits, and compared with every set the backends' modules hold."""

from __future__ import annotations

import numpy as np
import pytest

import modperf
from modperf.serving import BACKENDS, Constants
from modperf.serving.fit import MIN_ROWS, AggBatch, Row, covered_generations, fit_agg, nelder_mead
from modperf.serving.model import AggInputs
from modperf.serving.silicon import CALIBRATION, fit_constants, price_rows, silicon_rows


def test_the_constants_are_a_refit_on_the_calibration_rows() -> None:
    """Prices the 2,363 calibration rows (strictly: the fit never uses a substituted row) and
    refits; every constant of every (mode, generation) set equals the shipped one to the 4
    decimals the fit writes. About 15-20 s on an idle 2-core machine: the pricing, not the fit
    (under a second), is what takes the time."""
    rows = [r for r in silicon_rows() if r["split"] == CALIBRATION]
    db = modperf.open()  # the file's ids modperf.specs.model_names resolves, as the bench prices them
    priced = price_rows(db, rows, substitute=False)
    fitted = fit_constants(rows, priced)
    for name, result in fitted.items():
        shipped = BACKENDS[name].fitted.sets
        assert sorted(result.sets) == sorted(shipped), name
        for key, constants in result.sets.items():
            assert constants == pytest.approx(shipped[key], abs=2e-4), (name, key)
            assert BACKENDS[name].fitted.what[key] == result.what[key], (name, key)


def test_a_generation_without_calibration_rows_gets_the_physics_step() -> None:
    """TRT-LLM's calibration rows are H100: its Blackwell step is the op tables' own, its
    frontend the one fitted on the H100 rows (never H100's step residual)."""
    trtllm = BACKENDS["trtllm"]
    hopper, source_h = trtllm.constants("agg", "h100_sxm")
    blackwell, source_b = trtllm.constants("agg", "b200_sxm")
    assert (blackwell.s_pre, blackwell.s_dec) == (1.0, 1.0)
    assert (hopper.s_pre, hopper.s_dec) != (1.0, 1.0)
    assert (blackwell.tau0_ms, blackwell.kappa, blackwell.host_op_ms) == (hopper.tau0_ms, hopper.kappa,
                                                                         hopper.host_op_ms)
    assert "physics-only step" in source_b and "on blackwell" in source_b
    assert "agg rows of hopper" in source_h
    assert trtllm.constants("agg", "b200_sxm", fitted=False) == (Constants(), "physics only: no fitted constants")


def _row(generation: str, group: str, decode_ms: float, tpot_ms: float) -> Row:
    x = AggInputs(batch=1, isl=1000, osl=11, prefill_one_ms=100.0, packed=1, prefill_packed_ms=100.0,
                  decode_ms=decode_ms, capped_ms=decode_ms + 100.0, max_running=10)
    return Row(x, generation, (group, "s"), ttft_ms=150.0 + 0.5 * tpot_ms, tpot_ms=tpot_ms)


def test_step_scales_by_generation_recover_known_scales() -> None:
    """Rows made from known constants (one user: TPOT = s_dec x t_d, TTFT = tau0 + TPOT / 2 +
    s_pre x p1, with s_pre 1 and tau0 50 ms): the fit finds each generation's s_dec; a
    generation with fewer than MIN_ROWS rows keeps the physics step."""
    rows = [_row("hopper", f"g{i % 3}", 10.0 + i, 1.25 * (10.0 + i)) for i in range(MIN_ROWS)]
    rows += [_row("blackwell", f"h{i % 2}", 10.0 + i, 0.8 * (10.0 + i)) for i in range(MIN_ROWS)]
    rows += [_row("ampere", "a", 10.0, 20.0)]
    assert covered_generations(rows) == {"blackwell": MIN_ROWS, "hopper": MIN_ROWS}
    result = fit_agg(rows, host_floor=False)
    assert result.sets[("agg", "hopper")].s_dec == pytest.approx(1.25, abs=2e-3)
    assert result.sets[("agg", "blackwell")].s_dec == pytest.approx(0.8, abs=2e-3)
    assert result.sets[("agg", "*")].s_dec == 1.0 and result.sets[("agg", "*")].s_pre == 1.0
    assert "physics-only step" in result.what[("agg", "*")]


def test_the_vectorised_fit_solves_as_the_serving_model() -> None:
    """AggBatch solves every row at once; it matches modperf.serving.aggregated row by row
    (admission queue and host floor included)."""
    from modperf.serving import aggregated

    xs = [AggInputs(b, 1024, 129, 80.0, min(b, 8), 300.0, 12.0 + b / 10, 340.0, m, 900, 1)
          for b, m in ((1, 10), (8, 100), (64, 40), (300, 500))]
    rows = [Row(x, "hopper", ("g", "s"), 1.0, 1.0) for x in xs]
    batch = AggBatch(rows)
    c = Constants(0.9, 1.1, 40.0, 0.3, 0.02)
    ttft, tpot = batch.solve(np.full(4, 0.9), np.full(4, 1.1), 40.0, 0.3, 0.02)
    for i, x in enumerate(xs):
        one = aggregated(x, c)
        assert ttft[i] == pytest.approx(one.ttft_ms, rel=1e-9) and tpot[i] == pytest.approx(one.tpot_ms, rel=1e-9)


def test_nelder_mead_finds_a_known_minimum() -> None:
    x = nelder_mead(lambda v: (v[0] - 1.5) ** 2 + 10 * (v[1] + 2.0) ** 2 + (v[2] - 3.0) ** 2, [0.0, 0.0, 0.0],
                    [1.0, 1.0, 1.0])
    assert x == pytest.approx([1.5, -2.0, 3.0], abs=1e-3)
