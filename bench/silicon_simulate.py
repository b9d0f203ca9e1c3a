"""``bench/silicon.py --simulate``: the request-level simulation's mean TTFT and TPOT
(modperf.serving.percentiles) scored beside the closed form on the measured deployments, and a grouped
cross-validation on the calibration half that says which of the two predicts it better.

* **Scores** (both halves): every aggregated row both answer strictly (a row priced only with
  ``allow_substitute`` is left out, as the scoreboard's headline leaves it out), the closed
  form with the constants ``predict`` gives the row (its backend's, for its mode and its
  system's GPU generation: ``modperf.serving.backend_of(backend).constants``) and the
  simulation with its own fitted constants (src/modperf/serving/simulation_constants.py).
* **Cross-validation** (calibration rows only, aggregated, one measurement re-exported under
  several ids counted once; folds by model x system x backend, shuffled with seed 0, as
  ``--cv``): on each fold's training rows the closed form's constants are fitted as ``--fit``
  does (``modperf.serving.silicon.fit_constants``: per backend x generation), and so are the
  simulation's ``s_pre``, ``s_dec``, ``tau0`` and ``osl_spread`` (per backend, Nelder-Mead
  from the closed form's fitted values averaged over the backend's training rows, same loss:
  mean |log(pred / measured)| of TTFT plus TPOT); the held-out rows are predicted by each.
  Only rows both answer are used, so the two are scored on the same rows.

The simulation's forms differ only in how the closed loop starts: ``synchronised`` (every user
sends at time 0, as a benchmark starts) and ``random phases`` (first sends spread uniformly over
one closed-form cycle, seeded). Evaluation rows are scored, never fitted on.

Prints tables; asserts nothing.
"""

from __future__ import annotations

import collections
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from modperf import errors as E
from modperf.serving.fit import nelder_mead
from modperf.serving.percentiles import Prepared, SimConstants, prepare, run
from modperf.serving.predict import Priced, solve
from modperf.serving.silicon import calibration_rows, fit_constants

CONSTANTS_FILE = Path(__file__).resolve().parent.parent / "src" / "modperf" / "serving" / "simulation_constants.py"

#: The simulation's forms the cross-validation compares (``--simulate-forms all``): every user
#: starts at time 0 (as a benchmark does) and the output lengths spread by a fitted share; the
#: means over every request (the first wave too, as a benchmark counts it; the form kept,
#: modperf.serving.percentiles.MEASURE_FIRST_WAVE) or over the steady state (each user's first request
#: left out).
FORMS: dict[str, dict[str, Any]] = {
    "first wave measured": {"first_wave": True},
    "steady state": {"first_wave": False},
}
#: The Nelder-Mead budget of one fit (4 constants: s_pre, s_dec, tau0, osl_spread).
FIT_ITERATIONS = 45


def strict(p: Any) -> bool:
    """Priced without substitution (the rows the fit may use and the headline scores)."""
    return isinstance(p, Priced) and not p.substitutions


def prepare_all(rows: list[dict[str, Any]], priced: dict[str, Priced | E.ModperfError]
                ) -> tuple[dict[str, Prepared | E.ModperfError], float]:
    """The grid and scheduler of every aggregated row the closed form answers strictly."""
    out: dict[str, Prepared | E.ModperfError] = {}
    start = time.perf_counter()
    todo = [r for r in rows if r["mode"] == "agg" and strict(priced.get(r["id"]))]
    for i, r in enumerate(todo):
        try:
            out[r["id"]] = prepare(priced[r["id"]])
        except E.ModperfError as exc:
            out[r["id"]] = exc
        if (i + 1) % 500 == 0:
            print(f"  grids for {i + 1}/{len(todo)} rows in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return out, time.perf_counter() - start


def sim_means(prepared: Prepared, c: SimConstants, form: dict[str, Any]) -> tuple[float, float]:
    sim = run(prepared, c, **form)
    return float(np.mean(sim.ttft_ms)), float(np.mean(sim.tpot_ms))


def _stats(errs: list[tuple[float, float]]) -> str:
    t = np.array([e[0] for e in errs])
    p = np.array([e[1] for e in errs])
    return (f"TTFT {np.median(np.abs(t)):.2f} / {np.percentile(np.abs(t), 90):.2f} / {np.median(t):+.2f}   "
            f"TPOT {np.median(np.abs(p)):.2f} / {np.percentile(np.abs(p), 90):.2f} / {np.median(p):+.2f}")


def _loss(rows, fn) -> float:
    errs = []
    for r in rows:
        ttft, tpot = fn(r)
        errs.append(abs(math.log(ttft / r["silicon_ttft_ms"])) + abs(math.log(tpot / r["silicon_tpot_ms"])))
    return float(np.mean(errs))


def _bounded(x) -> SimConstants:
    s_pre, s_dec, tau0, spread = (float(v) for v in x)
    return SimConstants(min(max(s_pre, 0.3), 3.0), min(max(s_dec, 0.3), 3.0), min(max(tau0, 0.0), 1000.0),
                        min(max(spread, 0.0), 0.9))


def fit_simulation(group, prepared, form, x0: list[float]) -> SimConstants:
    """Nelder-Mead (modperf.serving.fit.nelder_mead, the closed form's) on the mean |log error|
    of TTFT plus TPOT of the simulation's means, from ``x0`` = (s_pre, s_dec, tau0,
    osl_spread), at most :data:`FIT_ITERATIONS` iterations."""

    def loss(x) -> float:
        c = _bounded(x)
        return _loss(group, lambda r: sim_means(prepared[r["id"]], c, form))

    steps = [0.15 * x0[0], 0.1 * x0[1], 30.0, 0.15]
    return _bounded(nelder_mead(loss, x0, steps, maxiter=FIT_ITERATIONS, xatol=1e-3, fatol=1e-4))


def closed_form_start(group, choice: Any = None) -> list[float]:
    """The simulation fit's start: the closed form's ``s_pre``, ``s_dec`` and ``tau0`` as
    ``predict`` gives them to each of ``group``'s rows (per backend x generation; ``choice`` as
    bench/silicon.py's row_constants takes it), averaged over the rows, and an output spread of
    0.1."""
    from silicon import row_constants

    cs = [row_constants(r, choice) for r in group]
    return [float(np.mean([c.s_pre for c in cs])), float(np.mean([c.s_dec for c in cs])),
            float(np.mean([c.tau0_ms for c in cs])), 0.1]


def _rounded(c: SimConstants) -> SimConstants:
    return SimConstants(*(round(float(v), 4) for v in (c.s_pre, c.s_dec, c.tau0_ms, c.osl_spread)))


def write_constants(fitted: dict[str, SimConstants], form: str, counts: dict[str, int]) -> None:
    stamp = time.strftime("%Y-%m-%d")
    lines = [
        '"""The simulation\'s fitted constants (docs/serving.md, "The simulation", lists each with its value).',
        "",
        "Written by ``python bench/silicon.py --simulate --fit`` from the CALIBRATION rows of the corpus's",
        "silicon_sample.csv only (aggregated; re-exports counted once); never edited by hand.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from .simulate import SimConstants",
        "",
        "AGG: dict[str, SimConstants] = {",
    ]
    for backend, c in sorted(fitted.items()):
        lines.append(f'    "{backend}": SimConstants(s_pre={c.s_pre}, s_dec={c.s_dec}, tau0_ms={c.tau0_ms}, '
                     f"osl_spread={c.osl_spread}),")
    lines.append("}")
    rows = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    lines.append(f'PROVENANCE = ("fitted {stamp} on calibration rows of silicon_sample.csv "')
    lines.append(f'              "({rows}; form: {form})")')
    CONSTANTS_FILE.write_text("\n".join(lines) + "\n")


def simulate_mode(rows, priced, *, folds: int = 4, cv: bool = True, fit: bool = False,
                  all_forms: bool = False) -> None:
    from silicon import row_constants

    from modperf.serving.percentiles import MEASURE_FIRST_WAVE, fitted_simulation_constants

    prepared, seconds = prepare_all(rows, priced)
    ready = {i: p for i, p in prepared.items() if isinstance(p, Prepared)}
    failed = collections.Counter(f"{type(p).__name__}: {p.detail[:80]}" for p in prepared.values()
                                 if not isinstance(p, Prepared))
    print(f"\nTHE SIMULATION: grids for {len(prepared)} aggregated rows the closed form answers in {seconds:.0f} s "
          f"({seconds / max(len(prepared), 1) * 1000:.0f} ms per row); {len(ready)} ready")
    for reason, n in failed.most_common(5):
        print(f"  {n:>5}  {reason}")
    substituted = sum(1 for r in rows if r["mode"] == "agg" and isinstance(priced.get(r["id"]), Priced)
                      and not strict(priced[r["id"]]))
    if substituted:
        print(f"  ({substituted} aggregated rows answered only with allow_substitute: left out)")
    calib = [r for r in calibration_rows(rows, priced, "agg") if r["id"] in ready]
    form_name = "first wave measured" if MEASURE_FIRST_WAVE else "steady state"
    forms = FORMS if all_forms else {form_name: FORMS[form_name]}

    if cv:
        # --- grouped cross-validation on the calibration rows both answer
        groups = sorted({(r["model_path"], r["system"], r["backend"]) for r in calib})
        random.Random(0).shuffle(groups)
        print(f"\ngrouped {folds}-fold cross-validation on the {len(calib)} calibration rows both answer "
              "(aggregated; constants per backend fitted on the training folds; |relative error| median / p90 / "
              "signed median)")
        errs: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
        start = time.perf_counter()
        for k in range(folds):
            held = {g for i, g in enumerate(groups) if i % folds == k}
            train = [r for r in calib if (r["model_path"], r["system"], r["backend"]) not in held]
            test = [r for r in calib if (r["model_path"], r["system"], r["backend"]) in held]
            # the closed form as --fit and --cv fit it: per backend x generation, training rows only
            cf = fit_constants(train, priced)
            for backend in sorted({r["backend"] for r in test}):
                group = [r for r in train if r["backend"] == backend]
                if not group:
                    continue
                for r in (r for r in test if r["backend"] == backend):
                    pred = solve(priced[r["id"]], row_constants(r, cf), "")
                    errs["closed form"].append((pred.ttft_ms / r["silicon_ttft_ms"] - 1,
                                                pred.tpot_ms / r["silicon_tpot_ms"] - 1))
                for name, form in forms.items():
                    cs = fit_simulation(group, ready, form, closed_form_start(group, cf))
                    for r in (r for r in test if r["backend"] == backend):
                        t, p = sim_means(ready[r["id"]], cs, form)
                        errs[f"simulation, {name}"].append((t / r["silicon_ttft_ms"] - 1,
                                                            p / r["silicon_tpot_ms"] - 1))
                    closed = {g: (c.s_pre, c.s_dec, c.tau0_ms, c.kappa, c.host_op_ms)
                              for (m, g), c in cf[backend].sets.items() if m == "agg"}
                    print(f"  fold {k} {backend}: closed form agg (s_pre, s_dec, tau0, kappa, host_op) {closed}; "
                          f"simulation ({name}) {_rounded(cs)} "
                          f"[{time.perf_counter() - start:.0f} s]", file=sys.stderr)
        for name, e in errs.items():
            print(f"  {name:<34} {_stats(e)}   ({len(e)} rows)")
        score = {name: float(np.median(np.abs([x[0] for x in e])) + np.median(np.abs([x[1] for x in e])))
                 for name, e in errs.items()}
        best = min(score, key=lambda name: score[name])
        print(f"  better on the calibration half (sum of the TTFT and TPOT medians): {best}")

    form = FORMS[form_name]
    if fit:
        fitted, counts = {}, {}
        start = time.perf_counter()
        for backend in sorted({r["backend"] for r in calib}):
            group = [r for r in calib if r["backend"] == backend]
            counts[backend] = len(group)
            x0 = closed_form_start(group)
            fitted[backend] = _rounded(fit_simulation(group, ready, form, x0))
            print(f"  fitted {backend} ({len(group)} rows) from {[round(v, 4) for v in x0]}: {fitted[backend]} "
                  f"[{time.perf_counter() - start:.0f} s]", file=sys.stderr)
        write_constants(fitted, form_name, counts)
        print(f"\nfitted the simulation ({form_name}, at most {FIT_ITERATIONS} Nelder-Mead iterations per backend) "
              f"on calibration rows {counts} in {time.perf_counter() - start:.0f} s; wrote {CONSTANTS_FILE}")
    else:
        fitted = fitted_simulation_constants()
    if not fitted:
        print("\nno fitted simulation constants (run --simulate --fit): scores skipped")
        return

    # --- scores on both halves
    agg = [r for r in rows if r["id"] in ready]
    print(f"\nmeans scored on the {len(agg)} aggregated rows both answer strictly (each with its own fitted "
          "constants: the closed form's per backend x generation as predict gives them; "
          f"simulation form: {form_name}; |relative error| median / p90 / signed median)")
    start = time.perf_counter()
    sims: dict[str, tuple[float, float]] = {}
    closed: dict[str, tuple[float, float]] = {}
    simulated_requests = 0
    for r in agg:
        pred = solve(priced[r["id"]], row_constants(r), "")
        closed[r["id"]] = (pred.ttft_ms, pred.tpot_ms)
        sim = run(ready[r["id"]], fitted.get(r["backend"], SimConstants()), **form)
        simulated_requests += sim.stats["requests"]
        sims[r["id"]] = (float(np.mean(sim.ttft_ms)), float(np.mean(sim.tpot_ms)))
    wall = time.perf_counter() - start
    print(f"  ({simulated_requests:,} requests simulated in {wall:.0f} s with the closed form beside: "
          f"{simulated_requests / wall:,.0f} requests/s)")
    for half in ("calib", "eval"):
        part = [r for r in agg if r["split"] == half]
        print(f"  {('calibration' if half == 'calib' else 'evaluation')} ({len(part)} rows)")
        for name, preds in (("closed form", closed), ("simulation", sims)):
            errs_ = [(preds[r["id"]][0] / r["silicon_ttft_ms"] - 1, preds[r["id"]][1] / r["silicon_tpot_ms"] - 1)
                     for r in part]
            print(f"    {name:<14} {_stats(errs_)}")
        for backend in sorted({r["backend"] for r in part}):
            sub = [r for r in part if r["backend"] == backend]
            for name, preds in (("closed form", closed), ("simulation", sims)):
                errs_ = [(preds[r["id"]][0] / r["silicon_ttft_ms"] - 1, preds[r["id"]][1] / r["silicon_tpot_ms"] - 1)
                         for r in sub]
                print(f"      {backend:<7} ({len(sub):>4}) {name:<12} {_stats(errs_)}")
