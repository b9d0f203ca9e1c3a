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
from typing import Any

from .predict import FIELDS, present

EVALUATION, CALIBRATION = "eval", "calib"


def split_of(model_path: str, system: str, backend: str, mode: str) -> str:
    key = f"{model_path}|{system}|{backend}|{mode}"
    return EVALUATION if int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 2 else CALIBRATION


def silicon_rows(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Every row of silicon_sample.csv (default: the embedded corpus's) as a dict, with its
    ``split``."""
    import pyarrow.csv as pacsv

    if path is None:
        from .fast.cache_keys import embedded_systems_dir

        path = embedded_systems_dir() / "silicon_sample.csv"
    table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(strings_can_be_null=True))
    rows = table.to_pylist()
    for r in rows:
        r["split"] = split_of(str(r["model_path"]), str(r["system"]), str(r["backend"]), str(r["mode"]))
    return rows


def question(row: dict[str, Any]) -> dict[str, Any]:
    """A row as a predict line: the deployment's columns, empty ones left out, whole floats
    (the CSV reader's) as integers."""
    out = {}
    for k in FIELDS:
        if present(row, k):
            v = row[k]
            out[k] = int(v) if isinstance(v, float) and v.is_integer() else v
    return out


__all__ = ["CALIBRATION", "EVALUATION", "question", "silicon_rows", "split_of"]
