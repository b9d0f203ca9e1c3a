"""The measured deployments the corpus ships (``systems/silicon_sample.csv``) as predict
questions, and the fixed calibration / evaluation split every fitted constant respects.

A row is **evaluation** when ``int(sha256(f"{model_path}|{system}|{backend}|{mode}")
.hexdigest()[:8], 16)`` is odd, otherwise **calibration** (issue 14; docs/serving.md). The key
is the deployment group, not the row, so that one model on one system and backend is never
on both sides.

May import: pyarrow; modperf.base, modperf.fast, modperf.predict.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base import errors as E
from . import BACKENDS, generation_of
from .fit import FitResult, Row, fit_agg, fit_disagg
from .predict import FIELDS, Priced, concurrency_of, deployment_from_row, present, price

if TYPE_CHECKING:
    from ..query.db import Database

EVALUATION, CALIBRATION = "eval", "calib"



def split_of(model_path: str, system: str, backend: str, mode: str) -> str:
    key = f"{model_path}|{system}|{backend}|{mode}"
    return EVALUATION if int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 2 else CALIBRATION


def silicon_rows(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Every row of silicon_sample.csv (default: the embedded corpus's) as a dict, with its
    ``split``."""
    import pyarrow.csv as pacsv

    if path is None:
        from ..fast.cache_keys import embedded_systems_dir

        path = embedded_systems_dir() / "silicon_sample.csv"
    table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(strings_can_be_null=True))
    rows = table.to_pylist()
    for r in rows:
        r["split"] = split_of(str(r["model_path"]), str(r["system"]), str(r["backend"]), str(r["mode"]))
    return rows


def question(row: dict[str, Any]) -> dict[str, Any]:
    """A row as a predict line: the deployment's columns, empty ones left out, whole floats
    (the CSV reader's) as integers; a disaggregated row's concurrency from its provenance column."""
    out = {}
    for k in FIELDS:
        if present(row, k):
            v = row[k]
            out[k] = int(v) if isinstance(v, float) and v.is_integer() else v
    if row.get("mode") == "disagg" and "concurrency" not in out:
        concurrency = concurrency_of(row)  # the provenance column's silicon_concurrency
        if concurrency is not None:
            out["concurrency"] = concurrency
    return out


def price_rows(db: Database, rows: list[dict[str, Any]], *, substitute: bool = True,
               progress: Any = None) -> dict[str, Priced | E.ModperfError]:
    """Every row priced strictly (:func:`modperf.predict.price`), or its error; with
    ``substitute``, a row a table refuses (NotCoveredError) is priced again with
    ``allow_substitute`` and kept where that answers with substitutions
    (``Priced.substitutions``): the scoreboard scores those apart, the fit never uses them.
    ``progress(i)`` is called after each row."""
    out: dict[str, Priced | E.ModperfError] = {}
    for i, r in enumerate(rows):
        dep = None
        try:
            dep = deployment_from_row(question(r))
            out[r["id"]] = price(db, dep)
        except E.ModperfError as exc:
            out[r["id"]] = exc
            if substitute and isinstance(exc, E.NotCoveredError) and dep is not None:
                try:
                    again: Priced | None = price(db, dep, allow_substitute=True)
                except E.ModperfError:
                    again = None
                if again is not None and again.substitutions:
                    out[r["id"]] = again
        if progress is not None:
            progress(i)
    return out


def calibration_rows(rows: list[dict[str, Any]], priced: dict[str, Any], mode: str | None = None
                     ) -> list[dict[str, Any]]:
    """The calibration rows the constants may be fitted on: priced strictly (no substitution, no
    assumed topology),
    of ``mode`` when given, and one measurement re-exported under several ids counted once."""
    calib, seen = [], set()
    for r in rows:
        pair = (r["silicon_ttft_ms"], r["silicon_tpot_ms"])
        p = priced.get(r["id"])
        if r["split"] != CALIBRATION or (mode and r["mode"] != mode) or pair in seen \
                or not isinstance(p, Priced) or p.substitutions or p.assumptions:
            continue
        seen.add(pair)
        calib.append(r)
    return calib


def fit_row(r: dict[str, Any], priced: dict[str, Any], generation: Any = "system") -> Row:
    """A row as :mod:`modperf.serving.fit` sees it; ``generation`` "system" takes its system's
    GPU generation, another value pools every row under it."""
    gen = generation_of(r["system"]) if generation == "system" else generation
    return Row(priced[r["id"]].inputs, gen, (r["model_path"], r["system"]), float(r["silicon_ttft_ms"]),
               float(r["silicon_tpot_ms"]))


def fit_constants(rows: list[dict[str, Any]], priced: dict[str, Any], generation: Any = "system",
                  host_floor: bool = True, disagg_host_floor: bool = False) -> dict[str, FitResult]:
    """Every backend's constants from the calibration rows among ``rows``
    (:mod:`modperf.serving.fit`): aggregated per backend, the disaggregated set shared (written
    into each backend's module). The other arguments select the forms the grouped
    cross-validation compares (docs/serving.md, "Form choices")."""
    calib = calibration_rows(rows, priced)
    disagg = fit_disagg([fit_row(r, priced, generation) for r in calib if r["mode"] == "disagg"],
                        host_floor=disagg_host_floor)
    out = {}
    for backend in sorted(BACKENDS):
        agg = fit_agg([fit_row(r, priced, generation) for r in calib if r["backend"] == backend
                       and r["mode"] == "agg"], host_floor=host_floor)
        out[backend] = FitResult({**agg.sets, **disagg.sets}, {**agg.what, **disagg.what})
    return out


__all__ = ["CALIBRATION", "EVALUATION", "calibration_rows", "fit_constants", "fit_row", "price_rows", "question",
           "silicon_rows", "split_of"]
