"""``modperf search --out DIR``: the fronts and the top K as CSV, the whole answer as JSON,
each file written through the one atomic write path (modperf.base.atomic: a killed run leaves the
old file or none, never half of one)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from ..base.atomic import text_writer, write_atomically
from ..base.jsonio import dumps
from .engine import Point, SearchResult

#: The figures every CSV row starts with; the deployment's choices follow (Point.summary).
FIGURES = ("tokens_per_s_per_gpu", "tokens_per_s_per_user", "ttft_ms", "tpot_ms", "concurrency", "gpus", "replicas")
CHOICES = ("mode", "backend", "version", "tp", "attention_dp", "moe_tp", "moe_ep", "batch", "workers",
           *(f"{side}_{f}" for side in ("prefill", "decode")
             for f in ("tp", "attention_dp", "moe_tp", "moe_ep", "batch", "workers")))


def rows(points: list[Point]) -> list[dict[str, Any]]:
    out = []
    for rank, p in enumerate(points, 1):
        row: dict[str, Any] = {"rank": rank, **{f: getattr(p, f) for f in FIGURES}}
        row.update({c: p.summary().get(c) for c in CHOICES})
        out.append(row)
    return out


def csv_text(points: list[Point]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=["rank", *FIGURES, *CHOICES], lineterminator="\n")
    writer.writeheader()
    for row in rows(points):
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buffer.getvalue()


def write_outputs(result: SearchResult, folder: str | Path) -> list[Path]:
    """``front_agg.csv``, ``front_disagg.csv`` (the modes searched), ``top.csv`` (the top K of
    each mode, by tokens/s/GPU) and ``search.json`` (the whole answer, as ``--json`` prints it)
    in ``folder`` (made if missing; files of these names are replaced)."""
    out = Path(folder).expanduser()
    written: list[Path] = []
    texts = {f"front_{m}.csv": csv_text(result.fronts[m]) for m in result.modes}
    texts["top.csv"] = csv_text([p for m in result.modes for p in result.top[m]])
    texts["search.json"] = dumps(result.to_dict(), indent=2) + "\n"
    for name, text in texts.items():
        target = out / name
        write_atomically(target, text_writer(text), overwrite=True)
        written.append(target)
    return written


__all__ = ["csv_text", "rows", "write_outputs"]
