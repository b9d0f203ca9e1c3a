"""The fit of the serving constants on calibration rows (docs/serving.md, "Constants").

``bench/silicon.py --fit`` prices the calibration rows of the corpus's silicon_sample.csv and
calls :func:`fit_backend` once per backend; ``tests/test_fit.py`` does the same and compares the
result with the constants the backends' modules carry. The form:

* the **step scales** ``s_pre``, ``s_dec`` (how the served engine's prefill and decode steps
  relate to the op tables' steps) are fitted per GPU generation, on the backend's aggregated
  rows of that generation, where the calibration half holds at least :data:`MIN_ROWS` rows of
  :data:`MIN_GROUPS` model x system groups; elsewhere the step is the op tables' own
  (physics only), never another generation's residual;
* the **frontend** ``tau0_ms``, ``kappa`` (the request path outside the engine, the
  synchronisation of the closed loop) is fitted per serving mode: on the aggregated rows
  together with the step scales, and on the disaggregated rows with worker counts (their
  steps scaled by the aggregated fit of their generation) where there are :data:`MIN_ROWS`.

Loss: the mean of ``|log(predicted / measured)|`` of TTFT plus that of TPOT (rows without a
TTFT answer count TPOT only); bounds ``s in [0.3, 3]``, ``tau0 in [0, 1000] ms``,
``kappa in [0, 1]``; a deterministic Nelder-Mead (:func:`nelder_mead`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .backend import ANY_GENERATION, GENERATIONS
from .model import AggInputs, Constants, DisaggInputs, closed_loop

#: A generation's step scales are fitted where the calibration half holds this many aggregated
#: rows of the backend on it, from at least :data:`MIN_GROUPS` model x system groups.
MIN_ROWS = 30
MIN_GROUPS = 2
#: Bounds of the fitted constants.
S_BOUNDS = (0.3, 3.0)
TAU0_BOUNDS = (0.0, 1000.0)
KAPPA_BOUNDS = (0.0, 1.0)


@dataclass(frozen=True)
class Row:
    """One calibration row as the fit sees it: its priced steps, the GPU generation of its
    system, its model x system group, and what was measured."""

    inputs: AggInputs | DisaggInputs
    generation: str | None
    group: tuple[str, str]
    ttft_ms: float
    tpot_ms: float


def nelder_mead(f: Callable[[np.ndarray], float], x0: Sequence[float], step: Sequence[float], *,
                maxiter: int = 2000, xatol: float = 1e-4, fatol: float = 1e-7) -> np.ndarray:
    """Minimise ``f`` from ``x0`` by Nelder-Mead (reflection 1, expansion 2, contraction 1/2,
    shrink 1/2), the initial simplex ``x0`` plus ``step`` along each axis; stops when the
    simplex spans less than ``xatol`` (relative to ``step``) and ``fatol`` in value."""
    x0 = np.asarray(x0, dtype=float)
    n = x0.size
    simplex = np.vstack([x0] + [x0 + np.eye(n)[i] * step[i] for i in range(n)])
    values = np.array([f(x) for x in simplex])
    scale = np.asarray(step, dtype=float)
    for _ in range(maxiter):
        order = np.argsort(values, kind="stable")
        simplex, values = simplex[order], values[order]
        if (np.max(np.abs(simplex[1:] - simplex[0]) / scale) <= xatol
                and np.max(np.abs(values[1:] - values[0])) <= fatol):
            break
        centroid = simplex[:-1].mean(axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2.0 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            toward = reflected if fr < values[-1] else simplex[-1]  # outside or inside contraction
            contracted = centroid + 0.5 * (toward - centroid)
            fc = f(contracted)
            if fc < min(fr, values[-1]):
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex[1:] = simplex[0] + 0.5 * (simplex[1:] - simplex[0])
                values[1:] = [f(x) for x in simplex[1:]]
    return np.asarray(simplex[int(np.argmin(values))])


def _clip(value: float, bounds: tuple[float, float]) -> float:
    return min(max(float(value), bounds[0]), bounds[1])


class AggBatch:
    """Aggregated rows as arrays, solved at once by :func:`modperf.serving.model.closed_loop`
    (admission queue included) for per-row step scales and shared frontend constants."""

    def __init__(self, rows: Sequence[Row]) -> None:
        xs = [r.inputs for r in rows]
        assert all(isinstance(x, AggInputs) for x in xs)

        def col(name: str) -> np.ndarray:
            return np.array([float(getattr(x, name)) for x in xs])

        self.batch, self.osl, self.one, self.packed = col("batch"), col("osl"), col("prefill_one_ms"), col("packed")
        self.packed_ms, self.decode, self.capped = col("prefill_packed_ms"), col("decode_ms"), col("capped_ms")
        self.running = np.minimum(self.batch, col("max_running"))
        self.ttft = np.array([r.ttft_ms for r in rows])
        self.tpot = np.array([r.tpot_ms for r in rows])

    def solve(self, s_pre: np.ndarray, s_dec: np.ndarray, tau0: float, kappa: float
              ) -> tuple[np.ndarray, np.ndarray]:
        c = Constants(1.0, 1.0, tau0, kappa)
        w = s_pre * self.packed_ms / self.packed
        td = s_dec * self.decode
        cap = np.maximum(td + s_pre * (self.capped - self.decode), td)
        own = s_pre * self.one
        m = self.running
        ttft, tpot, _, _, _ = closed_loop(m, self.osl - 1, w, td, cap, own, self.packed, c)
        wait = (self.batch - m) / m * (ttft + (self.osl - 1) * tpot)
        return ttft + wait, tpot

    def loss(self, s_pre: np.ndarray, s_dec: np.ndarray, tau0: float, kappa: float) -> float:
        ttft, tpot = self.solve(s_pre, s_dec, tau0, kappa)
        return float(np.mean(np.abs(np.log(ttft / self.ttft)) + np.abs(np.log(tpot / self.tpot))))


class DisaggBatch:
    """Disaggregated rows as arrays (``modperf.serving.model.disaggregated`` on each). Rows
    without worker counts (no prefill side) count TPOT only."""

    def __init__(self, rows: Sequence[Row]) -> None:
        self.rows = [r for r in rows if isinstance(r.inputs, DisaggInputs)]
        full = [r.inputs.concurrency is not None for r in self.rows if isinstance(r.inputs, DisaggInputs)]
        self.full = np.array(full, dtype=bool)
        xs = [r.inputs for r in self.rows]

        def col(name: str, default: float = np.nan) -> np.ndarray:
            out = []
            for x in xs:
                v = getattr(x, name)
                out.append(default if v is None else float(v))
            return np.array(out)

        self.conc, self.ranks, self.one = col("concurrency"), col("prefill_ranks"), col("prefill_one_ms")
        self.packed_ms, self.packed, self.decode = col("prefill_packed_ms"), col("packed"), col("decode_ms")
        self.kv, self.osl = col("kv_transfer_ms"), col("osl")
        self.ttft = np.array([r.ttft_ms for r in self.rows])
        self.tpot = np.array([r.tpot_ms for r in self.rows])

    def solve(self, s_pre: np.ndarray, s_dec: np.ndarray, tau0: float, kappa: float
              ) -> tuple[np.ndarray, np.ndarray]:
        tpot = s_dec * self.decode
        w = s_pre * self.packed_ms / self.packed
        queue = kappa * np.maximum(0.0, (self.conc / self.ranks - 1.0) / 2.0) * w
        ttft = tau0 + s_pre * self.one + self.kv + queue
        floor = self.conc * w / self.ranks - (self.osl - 1) * tpot
        return np.maximum(ttft, floor), tpot

    def loss(self, s_pre: np.ndarray, s_dec: np.ndarray, tau0: float, kappa: float) -> float:
        ttft, tpot = self.solve(s_pre, s_dec, tau0, kappa)
        err = np.abs(np.log(tpot / self.tpot))
        err = err + np.where(self.full, np.abs(np.log(np.where(self.full, ttft, 1.0) / self.ttft)), 0.0)
        return float(np.mean(err))


def covered_generations(rows: Sequence[Row]) -> dict[str, int]:
    """The generations whose step scales the aggregated ``rows`` may fit (:data:`MIN_ROWS`
    rows of :data:`MIN_GROUPS` groups), with their row counts."""
    out: dict[str, int] = {}
    for generation in sorted({r.generation for r in rows if r.generation}):
        mine = [r for r in rows if r.generation == generation]
        if len(mine) >= MIN_ROWS and len({r.group for r in mine}) >= MIN_GROUPS:
            out[generation] = len(mine)
    return out


@dataclass(frozen=True)
class FitResult:
    """The constants of one backend, as :class:`modperf.serving.Fitted` holds them, and the
    rows behind each set."""

    sets: dict[tuple[str, str], Constants]
    what: dict[tuple[str, str], str]


def fit_backend(agg: Sequence[Row], disagg: Sequence[Row]) -> FitResult:
    """The constants of one backend from its aggregated and disaggregated calibration rows
    (module doc)."""
    covered = covered_generations(agg)
    gens = list(covered)
    step: dict[str, tuple[float, float]] = {}
    agg_frontend: tuple[float, float] | None = None
    if agg:
        batch = AggBatch(agg)
        index = np.array([gens.index(r.generation) if r.generation in covered else -1 for r in agg])

        def scales(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            s_pre, s_dec = np.ones(len(agg)), np.ones(len(agg))
            for i in range(len(gens)):
                s_pre[index == i] = _clip(x[2 * i], S_BOUNDS)
                s_dec[index == i] = _clip(x[2 * i + 1], S_BOUNDS)
            return s_pre, s_dec

        def agg_loss(x: np.ndarray) -> float:
            s_pre, s_dec = scales(x)
            return batch.loss(s_pre, s_dec, _clip(x[-2], TAU0_BOUNDS), _clip(x[-1], KAPPA_BOUNDS))

        x0 = [1.0, 1.0] * len(gens) + [100.0, 0.3]
        steps = [0.1, 0.1] * len(gens) + [20.0, 0.1]
        x = nelder_mead(agg_loss, x0, steps)
        for i, g in enumerate(gens):
            step[g] = (_clip(x[2 * i], S_BOUNDS), _clip(x[2 * i + 1], S_BOUNDS))
        agg_frontend = (_clip(x[-2], TAU0_BOUNDS), _clip(x[-1], KAPPA_BOUNDS))
    disagg_frontend: tuple[float, float] | None = None
    full = [r for r in disagg if isinstance(r.inputs, DisaggInputs) and r.inputs.concurrency is not None]
    if len(full) >= MIN_ROWS:
        dbatch = DisaggBatch(full)
        s_pre = np.array([step.get(r.generation or "", (1.0, 1.0))[0] for r in full])
        s_dec = np.array([step.get(r.generation or "", (1.0, 1.0))[1] for r in full])

        def disagg_loss(x: np.ndarray) -> float:
            return dbatch.loss(s_pre, s_dec, _clip(x[0], TAU0_BOUNDS), _clip(x[1], KAPPA_BOUNDS))

        y = nelder_mead(disagg_loss, [200.0, 0.3], [20.0, 0.1])
        disagg_frontend = (_clip(y[0], TAU0_BOUNDS), _clip(y[1], KAPPA_BOUNDS))
    sets: dict[tuple[str, str], Constants] = {}
    what: dict[tuple[str, str], str] = {}
    n_agg = len(agg)
    for mode, frontend, rows_used in (("agg", agg_frontend, n_agg), ("disagg", disagg_frontend, len(full))):
        for generation in dict.fromkeys([*GENERATIONS.values(), *step, ANY_GENERATION]):
            s_pre_g, s_dec_g = step.get(generation, (1.0, 1.0))
            tau0, kappa = frontend or (0.0, 0.0)
            sets[(mode, generation)] = Constants(round(s_pre_g, 4), round(s_dec_g, 4), round(tau0, 4),
                                                 round(kappa, 4))
            if generation in step:
                where = f"step fitted on {covered[generation]} aggregated rows of {generation}"
            else:
                where = "physics-only step (the calibration half holds too few aggregated rows of this generation)"
            front = (f"frontend fitted on {rows_used} {mode} rows" if frontend is not None
                     else f"no frontend fitted (fewer than {MIN_ROWS} {mode} rows with TTFT)")
            what[(mode, generation)] = f"{where}; {front}"
    return FitResult(sets, what)


__all__ = ["MIN_GROUPS", "MIN_ROWS", "AggBatch", "DisaggBatch", "FitResult", "Row", "covered_generations",
           "fit_backend", "nelder_mead"]
