"""``modperf check``."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from ..audit.check import CheckReport, check
from ..data.quality import Thresholds
from ._app import app
from ._audit_format import label_words
from ._common import (
    DataRootOpt,
    JsonOpt,
    ModelConfigsOpt,
    PathsArg,
    TableOpt,
    WideOpt,
    console,
    emit_json,
    handles_errors,
    paths_or_none,
    print_failure,
    print_table,
    progress,
)
from ._quality_view import print_quality


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


#: The per-family table's columns a narrow terminal leaves out, first to last (family never).
FAMILY_COLUMNS_DROPPED = ("buckets", "merged", "tier", "natives")


def print_report(report: CheckReport) -> None:
    grid = Table(title="check, per family")
    for col in ("family", "tier", "files", "rows", "buckets", "natives", "merged", "failures"):
        grid.add_column(col, justify="left" if col in ("family", "tier", "natives") else "right",
                        no_wrap=col not in ("natives", "family"))
    for s in report.families.values():
        grid.add_row(
            s.family, s.tier if s.head_axis else "-", f"{s.files - s.files_failed}/{s.files}", f"{s.rows:,}",
            f"{s.buckets:,}",
            ", ".join(map(str, sorted(s.natives))) or "-", f"{s.duplicates_merged:,}",
            f"[red]{s.failures}[/]" if s.failures else "0",
        )
    print_table(grid, FAMILY_COLUMNS_DROPPED)
    agreements = [a for s in report.families.values() for a in s.agreement]
    if agreements:
        agree = Table(title="local-only evidence: natives measured at the same local key")
        for col in ("table", "natives", "shared keys", "median diff", "p95 diff", "max diff"):
            agree.add_column(col)
        for a in agreements:
            agree.add_row(label_words(a["table"]), " vs ".join(map(str, a["natives"])), str(a["shared_keys"]),
                          _pct(a["median_rel_diff"]), _pct(a["p95_rel_diff"]), _pct(a["max_rel_diff"]))
        print_table(agree, ("p95 diff", "median diff"))
    console.print("tiers: local = local heads complete the key; native+local = \\[native]\\[local]; native = "
                  "native-keyed by contract; - = no head axis. merged = duplicate rows folded by the lower-median "
                  "rule.",
                  style="dim")
    for failure in report.failures:
        strict = " (a warning; --strict)" if failure.severity == "warning" else ""
        print_failure(failure, note=strict)
    for warning in report.warnings:
        print_failure(warning, "[yellow]WARN[/]")
    console.print(
        f"{len(report.files)} tables, {report.rows:,} rows checked in {report.seconds:.1f} s: {verdict(report)}"
        + (f" ({report.skipped} table files no family declares skipped)" if report.skipped else "")
    )


def verdict(report: CheckReport) -> str:
    """``clean``, ``clean, 1 warning``, ``2 failure(s)``..., and under --strict how many of the
    failures are warnings."""
    warnings = len(report.warnings)
    counted = f", {warnings} warning{'s' if warnings != 1 else ''}" if warnings else ""
    if report.ok:
        return f"[green]clean[/]{counted}"
    promoted = sum(f.severity == "warning" for f in report.failures)
    strict = f" ({promoted} warning{'s' if promoted != 1 else ''} failed by --strict)" if promoted else ""
    return f"[red]{len(report.failures)} failure(s)[/]{strict}{counted}"


@app.command("check")
@handles_errors
def check_command(
    paths: PathsArg = None,
    table: TableOpt = None,
    data_root: DataRootOpt = None,
    model_configs: ModelConfigsOpt = None,
    json_out: JsonOpt = False,
    quality: Annotated[bool, typer.Option("--quality", help="Also flag implausible data (non-monotone series, spikes, "
                                          "disagreement with other versions/backends); findings never change the "
                                          "exit code.")] = False,
    monotone_tolerance: Annotated[float, typer.Option("--monotone-tolerance", help="--quality: relative fall allowed "
                                  "between neighbouring batch or sequence points.")] = Thresholds.monotone_tolerance,
    spike_factor: Annotated[float, typer.Option("--spike-factor", help="--quality: a point above both neighbours by "
                            "more than this factor is a spike.")] = Thresholds.spike_factor,
    cross_factor: Annotated[float, typer.Option("--cross-factor", help="--quality: flag a point off by more than this "
                            "factor from every other version/backend measuring its key.")] = Thresholds.cross_factor,
    min_delta_ms: Annotated[float, typer.Option("--min-delta-ms", help="--quality: ignore differences smaller than "
                            "this (ms).")] = Thresholds.min_delta_ms,
    quality_examples: Annotated[int, typer.Option("--quality-examples", help="--quality: findings listed per table "
                                "and kind (0 = all).")] = 10,
    strict: Annotated[bool, typer.Option("--strict", help="Fail on warnings too (exit 1): for collectors' CI "
                                         "gates.")] = False,
    wide: WideOpt = False,
) -> None:
    """Load every declared table with all guards; exit 0 when clean (warnings listed), 1 on failures (or, with
    --strict, warnings), 2 on usage errors."""
    thresholds = Thresholds(monotone_tolerance, spike_factor, cross_factor, min_delta_ms)
    if quality:
        thresholds.validate()  # a bad threshold is a usage error before any work
    with progress("checking", enabled=not json_out) as on_progress:
        report = check(paths_or_none(paths), data_root=str(data_root) if data_root else None, table=table,
                       model_configs=[str(p) for p in model_configs or []], on_progress=on_progress,
                       quality=thresholds if quality else None, quality_examples=quality_examples, strict=strict)
    if json_out:
        emit_json(report.to_dict())
    else:
        print_report(report)
        if report.quality is not None:
            print_quality(report.quality)
    raise typer.Exit(0 if report.ok else 1)
