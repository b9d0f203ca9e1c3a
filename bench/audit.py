"""Whole-corpus audit timings: ``dedupe`` and ``coverage`` (goal: each under 30 s on a 2-core
machine), plus ``check --quality`` and a plain pyarrow read of the same files for scale.

    python bench/audit.py [--data-root DIR] [--repeat N] [--workers N]

Prints a table; asserts nothing (timings vary with the machine).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from modperf.audit.coverage import coverage
from modperf.audit.dedupe import dedupe
from modperf.data.catalog import Catalog
from modperf.data.families import model_head_axis_tables
from modperf.data.quality import assess

GOAL_SECONDS = 30.0


def _plain_read(root: str | None) -> dict[str, Any]:
    refs = Catalog.scan(root).select(tables=model_head_axis_tables())  # what dedupe and coverage read
    rows = 0
    for ref in refs:
        if ref.format == "parquet":
            rows += pq.read_table(ref.path).num_rows
    return {"files": len(refs), "rows": rows}


def _write(root: str | None, workers: int | None) -> Any:
    with tempfile.TemporaryDirectory(prefix="modperf-dedupe-") as out:
        return dedupe(data_root=root, workers=workers, write=out)


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--repeat", type=int, default=1, help="runs per step; the best is shown")
    parser.add_argument("--workers", type=int, default=None, help="thread pool size (default: min(4, cores))")
    args = parser.parse_args(argv)
    root, workers = args.data_root, args.workers

    steps: list[tuple[str, Callable[[], Any], Callable[[Any], str]]] = [
        ("plain pyarrow read (reference)", lambda: _plain_read(root),
         lambda r: f"{r['files']} files, {r['rows']:,} rows"),
        ("modperf dedupe (whole corpus)", lambda: dedupe(data_root=root, workers=workers),
         lambda r: (f"{r.totals()['files']} files, {r.totals()['rows']:,} rows -> {r.totals()['identities']:,} "
                    f"identities; {r.totals()['duplicate_rows']:,} duplicate rows "
                    f"({r.totals()['alias_duplicate_rows']:,} alias)")),
        ("modperf dedupe --write (whole corpus)", lambda: _write(root, workers),
         lambda r: f"{r.totals()['files_written']} tables written and verified, {r.totals()['identities']:,} rows"),
        ("modperf coverage (whole corpus)", lambda: coverage(data_root=root, workers=workers),
         lambda r: (f"{len(r.slots)} slots, {sum(len(s.natives) for s in r.slots)} (slot, native) rows, "
                    f"{sum(len(n.cells) for s in r.slots for n in s.natives):,} cells")),
        ("modperf check --quality, quality part (every declared table)",
         lambda: assess(data_root=root, workers=workers),
         lambda r: ", ".join(f"{k} {v:,}" for k, v in r.totals().items()
                             if k in ("non_monotone", "spike", "cross_file", "cross_file_corroborated"))),
    ]
    grid = Table(title=f"whole-corpus audits ({os.cpu_count()} cores, best of {args.repeat})")
    for col in ("step", "seconds", "goal", "what"):
        grid.add_column(col, justify="right" if col == "seconds" else "left")
    for name, fn, describe in steps:
        seconds, result = _timed(fn, args.repeat)
        goal = "" if "reference" in name or "quality" in name or "--write" in name else (
            f"< {GOAL_SECONDS:.0f} s: " + ("met" if seconds < GOAL_SECONDS else "MISSED"))
        grid.add_row(name, f"{seconds:.2f}", goal, describe(result))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Console().print(grid)
    Console().print(f"peak RSS of this process: {peak:,.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
