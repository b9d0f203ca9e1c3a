"""The fit of the serving constants on calibration rows (docs/serving.md, "Constants").

``bench/silicon.py --fit`` prices the calibration rows of the corpus's silicon_sample.csv and
calls :func:`fit_agg` once per backend and :func:`fit_disagg` once; ``tests/test_fit.py`` does
the same and compares the result with the constants the backends' modules carry. The form:

* the **step scales** ``s_pre``, ``s_dec`` (how the served engine's prefill and decode steps
  relate to the op tables' steps) are fitted per GPU generation, on the backend's aggregated
  rows of that generation, where the calibration half holds at least :data:`MIN_ROWS` rows of
  :data:`MIN_GROUPS` model x system groups; elsewhere the step is the op tables' own
  (physics only), never another generation's residual;
* the **frontend** ``tau0_ms``, ``kappa`` (the request path outside the engine, the
  synchronisation of the closed loop) and the **host floor** ``host_op_ms`` (the host's time
  per op of an eager step) are fitted per backend on its aggregated rows, together with the
  step scales;
* **disaggregated** deployments get one set (step scales and frontend) for every backend,
  fitted on the disaggregated rows with worker counts.

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
    start = np.asarray(x0, dtype=float)
    n = start.size
    simplex = np.vstack([start] + [start + np.eye(n)[i] * step[i] for i in range(n)])
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


#: Bounds of the host's time per eager op (ms).
HOST_BOUNDS = (0.0, 2.0)


class AggBatch:
    """Aggregated rows as arrays, solved at once by :func:`modperf.serving.model.closed_loop`
    (host floor and admission queue included) for per-row step scales and shared constants."""

    def __init__(self, rows: Sequence[Row]) -> None:
        xs = [r.inputs for r in rows]
        assert all(isinstance(x, AggInputs) for x in xs)

        def col(name: str) -> np.ndarray:
            return np.array([float(getattr(x, name)) for x in xs])

        self.batch, self.osl, self.one, self.packed = col("batch"), col("osl"), col("prefill_one_ms"), col("packed")
        self.packed_ms, self.decode, self.capped = col("prefill_packed_ms"), col("decode_ms"), col("capped_ms")
        self.ops, self.chunks = col("prefill_ops"), col("prefill_chunks")
        self.alone = np.array([getattr(x, "scheduler", "mixed") == "prefill_first" for x in xs])
        self.running = np.minimum(self.batch, col("max_running"))
        self.ttft = np.array([r.ttft_ms for r in rows])
        self.tpot = np.array([r.tpot_ms for r in rows])

    def solve(self, s_pre: np.ndarray, s_dec: np.ndarray, tau0: float, kappa: float, host: float = 0.0
              ) -> tuple[np.ndarray, np.ndarray]:
        c = Constants(1.0, 1.0, tau0, kappa)
        floor = self.ops * host
        w = np.maximum(s_pre * self.packed_ms, floor) / self.packed
        td = s_dec * self.decode
        cap = np.where(self.alone, td + w * self.packed,
                       np.maximum(np.maximum(td + s_pre * (self.capped - self.decode), td), floor))
        own = np.maximum(s_pre * self.one, self.chunks * floor)
        m = self.running
        ttft, tpot, _, _, _ = closed_loop(m, self.osl - 1, w, td, cap, own, self.packed, c)
        wait = (self.batch - m) / m * (ttft + (self.osl - 1) * tpot)
        return ttft + wait, tpot

    def loss(self, s_pre: np.ndarray, s_dec: np.ndarray, tau0: float, kappa: float, host: float = 0.0) -> float:
        ttft, tpot = self.solve(s_pre, s_dec, tau0, kappa, host)
        return float(np.mean(np.abs(np.log(ttft / self.ttft)) + np.abs(np.log(tpot / self.tpot))))


class DisaggBatch:
    """Disaggregated rows with worker counts as arrays (``modperf.serving.model.disaggregated``
    on each)."""

    def __init__(self, rows: Sequence[Row]) -> None:
        xs = [r.inputs for r in rows]
        assert all(isinstance(x, DisaggInputs) and x.concurrency is not None for x in xs)

        def col(name: str) -> np.ndarray:
            return np.array([float(getattr(x, name)) for x in xs])

        self.conc, self.ranks, self.one = col("concurrency"), col("prefill_ranks"), col("prefill_one_ms")
        self.packed_ms, self.packed, self.decode = col("prefill_packed_ms"), col("packed"), col("decode_ms")
        self.kv, self.osl, self.ops, self.chunks = col("kv_transfer_ms"), col("osl"), col("prefill_ops"), \
            col("prefill_chunks")
        self.ttft = np.array([r.ttft_ms for r in rows])
        self.tpot = np.array([r.tpot_ms for r in rows])

    def solve(self, s_pre: float, s_dec: float, tau0: float, kappa: float, host: float = 0.0
              ) -> tuple[np.ndarray, np.ndarray]:
        tpot = s_dec * self.decode
        floor = self.ops * host
        w = np.maximum(s_pre * self.packed_ms, floor) / self.packed
        queue = kappa * np.maximum(0.0, (self.conc / self.ranks - 1.0) / 2.0) * w
        ttft = tau0 + np.maximum(s_pre * self.one, self.chunks * floor) + self.kv + queue
        capacity = self.conc * w / self.ranks - (self.osl - 1) * tpot
        return np.maximum(ttft, capacity), tpot

    def loss(self, s_pre: float, s_dec: float, tau0: float, kappa: float, host: float = 0.0) -> float:
        ttft, tpot = self.solve(s_pre, s_dec, tau0, kappa, host)
        return float(np.mean(np.abs(np.log(ttft / self.ttft)) + np.abs(np.log(tpot / self.tpot))))


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
    """Fitted constants as :class:`modperf.serving.Fitted` holds them: per ``(mode,
    generation)``, and what stands behind each set."""

    sets: dict[tuple[str, str], Constants]
    what: dict[tuple[str, str], str]


def _rounded(s_pre: float, s_dec: float, tau0: float, kappa: float, host: float) -> Constants:
    return Constants(round(s_pre, 4), round(s_dec, 4), round(tau0, 4), round(kappa, 4), round(host, 5))


def fit_agg(rows: Sequence[Row], *, host_floor: bool = True) -> FitResult:
    """One backend's aggregated constants (module doc): step scales per covered generation,
    the frontend and the host's time per eager op shared. ``host_floor=False`` fixes the
    latter at 0 (the form it is compared with)."""
    covered = covered_generations(rows)
    gens = list(covered)
    if not rows:
        return FitResult({}, {})
    batch = AggBatch(rows)
    index = np.array([gens.index(r.generation) if r.generation in covered else -1 for r in rows])

    def unpack(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float, float]:
        s_pre, s_dec = np.ones(len(rows)), np.ones(len(rows))
        for i in range(len(gens)):
            s_pre[index == i] = _clip(x[2 * i], S_BOUNDS)
            s_dec[index == i] = _clip(x[2 * i + 1], S_BOUNDS)
        k = 2 * len(gens)
        host = _clip(x[k + 2], HOST_BOUNDS) if host_floor else 0.0
        return s_pre, s_dec, _clip(x[k], TAU0_BOUNDS), _clip(x[k + 1], KAPPA_BOUNDS), host

    x0 = [1.0, 1.0] * len(gens) + [100.0, 0.3] + ([0.05] if host_floor else [])
    steps = [0.1, 0.1] * len(gens) + [20.0, 0.1] + ([0.02] if host_floor else [])
    x = nelder_mead(lambda v: batch.loss(*unpack(v)), x0, steps)
    _, _, tau0, kappa, host = unpack(x)
    sets: dict[tuple[str, str], Constants] = {}
    what: dict[tuple[str, str], str] = {}
    for generation in dict.fromkeys([*GENERATIONS.values(), *gens, ANY_GENERATION]):
        if generation in covered:
            i = gens.index(generation)
            s_pre, s_dec = _clip(x[2 * i], S_BOUNDS), _clip(x[2 * i + 1], S_BOUNDS)
            where = f"step fitted on {covered[generation]} agg rows of {generation}"
        else:
            s_pre = s_dec = 1.0
            where = "physics-only step (too few agg calibration rows on this generation)"
        sets[("agg", generation)] = _rounded(s_pre, s_dec, tau0, kappa, host)
        what[("agg", generation)] = f"{where}; frontend, host floor: {len(rows)} agg rows"
    return FitResult(sets, what)


def fit_disagg(rows: Sequence[Row], *, host_floor: bool = False) -> FitResult:
    """The disaggregated constants, one set for every backend and generation: fitted on the
    disaggregated calibration rows with worker counts where there are :data:`MIN_ROWS` of
    them (the calibration half holds 91, of 5 model x system x backend groups: too few to split
    by backend), else none. No host floor by default: with one, the grouped cross-validation
    scored TTFT worse (docs/serving.md, "Form choices")."""
    full = [r for r in rows if isinstance(r.inputs, DisaggInputs) and r.inputs.concurrency is not None]
    if len(full) < MIN_ROWS:
        return FitResult({}, {})
    batch = DisaggBatch(full)

    def unpack(x: np.ndarray) -> tuple[float, float, float, float, float]:
        host = _clip(x[4], HOST_BOUNDS) if host_floor else 0.0
        return (_clip(x[0], S_BOUNDS), _clip(x[1], S_BOUNDS), _clip(x[2], TAU0_BOUNDS), _clip(x[3], KAPPA_BOUNDS),
                host)

    x0 = [1.0, 1.0, 200.0, 0.3] + ([0.05] if host_floor else [])
    steps = [0.1, 0.1, 20.0, 0.1] + ([0.02] if host_floor else [])
    x = nelder_mead(lambda v: batch.loss(*unpack(v)), x0, steps)
    groups = len({r.group for r in full})
    return FitResult({("disagg", ANY_GENERATION): _rounded(*unpack(x))},
                     {("disagg", ANY_GENERATION): f"step and frontend fitted on {len(full)} disagg rows of {groups} "
                                                  "groups, every backend"})


__all__ = ["MIN_GROUPS", "MIN_ROWS", "AggBatch", "DisaggBatch", "FitResult", "Row", "covered_generations",
           "fit_agg", "fit_disagg", "nelder_mead"]
