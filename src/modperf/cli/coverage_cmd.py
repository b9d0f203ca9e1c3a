"""``modperf coverage``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ..audit.coverage import (
    STANDARD_TP,
    CoverageDiff,
    CoverageReport,
    ModelCoverage,
    coverage,
    coverage_diff,
    model_coverage,
    parse_tps,
    to_csv,
)
from ..base import errors as E
from ._app import app
from ._audit_format import short_count
from ._common import (
    DataRootOpt,
    JsonOpt,
    ModelConfigsOpt,
    PathsArg,
    TableOpt,
    console,
    emit_json,
    err_console,
    handles_errors,
    paths_or_none,
    progress,
)

LEGEND = ("cells: grid points; [green]green[/] = measured for this native (tp-chain rows or tp=1 sweep rows at "
          "local = native/tp), [yellow]yellow[/] = answerable only through the local key (local-only tables), "
          "[red]·[/] = not measured, blank = tp does not divide the native. Other tp divisors: --tp, --json, --csv.")


def _cell_text(cell: Any) -> str:
    if cell is None:
        return ""
    if cell.measured:
        return f"[green]{short_count(cell.points)}[/]"
    if cell.answerable:
        return f"[yellow]{short_count(cell.points)}[/]"
    return "[red]·[/]"


def print_matrix(report: CoverageReport, tps: list[int]) -> None:
    grid = Table(title="coverage: native x tp (local = native / tp)")
    for col in ("system", "backend", "version", "table", "native", "models"):
        grid.add_column(col, overflow="fold")
    for t in tps:
        grid.add_column(f"tp{t}", justify="right", no_wrap=True)
    grid.add_column("notes", overflow="fold")
    for s in report.slots:
        # a table file outside the standard layout has no version (blank, like its system and backend)
        version = (s.ref.version or "") + (f" ←{s.ref.reuse.from_version}" if s.ref.reuse else "")
        if not s.ok:
            grid.add_row(s.ref.system, s.ref.backend, version, s.ref.table, "", "", *[""] * len(tps),
                         f"[red]failed to load ({len(s.failures)} failures)[/]")
            continue
        if not s.natives:
            grid.add_row(s.ref.system, s.ref.backend, version, s.ref.table, "-", "", *[""] * len(tps),
                         "no native recorded; locals " + ",".join(map(str, s.locals)))
            continue
        for nc in s.natives:
            cells = [_cell_text(nc.cell(t)) if nc.native % t == 0 else "" for t in tps]
            note = f"undeployable locals {','.join(map(str, nc.undeployable_locals))}" if nc.undeployable_locals else ""
            models = ", ".join(m.split("/")[-1] for m in nc.models)
            grid.add_row(s.ref.system, s.ref.backend, version, s.ref.table, str(nc.native), models, *cells, note)
    console.print(grid)
    console.print(LEGEND, style="dim")


def print_diff(result: CoverageDiff) -> None:
    grid = Table(title=f"coverage change {result.before} → {result.after}")
    for col in ("system", "backend", "table", "status", "native", "gained tp", "lost tp", "points before → after"):
        grid.add_column(col, overflow="fold")
    changed = [s for s in result.slots if s.changed]
    for s in changed:
        status = {"both": "", "only_before": f"[red]only in {result.before}[/]",
                  "only_after": f"[green]new in {result.after}[/]"}[s.status]
        if not s.natives:
            gained = ",".join(map(str, s.locals_gained))
            lost = ",".join(map(str, s.locals_lost))
            grid.add_row(s.system, s.backend, s.table, status, "-", f"locals {gained}" if gained else "",
                         f"locals {lost}" if lost else "", "")
        for nat, d in s.natives.items():
            before, after = sum(d["points_before"].values()), sum(d["points_after"].values())
            grid.add_row(s.system, s.backend, s.table, status, str(nat),
                         f"[green]{','.join(map(str, d['gained']))}[/]", f"[red]{','.join(map(str, d['lost']))}[/]",
                         f"{before:,} → {after:,}")
    console.print(grid)
    console.print(f"{len(changed)} of {len(result.slots)} (system, backend, table) changed between "
                  f"{result.before} and {result.after}", style="dim")


def print_model(result: ModelCoverage) -> None:
    grid = Table(title=f"{result.model} (native {result.native}): answerable without substitution")
    for col in ("system", "backend", "version", "table", "match"):
        grid.add_column(col, overflow="fold")
    for t in result.tps:
        grid.add_column(f"tp{t}\nlocal {result.native // t}" if result.native % t == 0 else f"tp{t}",
                        justify="right", no_wrap=True)
    for a in result.answers:
        cells = []
        for t in result.tps:
            c = a.cells.get(t)
            if c is None:
                cells.append("n/a")
            elif c.answerable:
                colour = "green" if c.measured else "yellow"
                cells.append(f"[{colour}]✓ {short_count(c.points)} {c.via}[/]")
            else:
                cells.append("[red]✗[/]")
        version = (a.ref.version or "") + (f" ←{a.ref.reuse.from_version}" if a.ref.reuse else "")
        grid.add_row(a.ref.system, a.ref.backend, version, a.ref.table, a.match, *cells)
    console.print(grid)
    summary = result.summary()
    per_tp = ", ".join(f"tp{t}: {n}" for t, n in summary["slots_answering_tp"].items())
    console.print(f"{summary['slots_considered']} slots considered; answering {per_tp}; "
                  f"{len(summary['slots_answering_every_tp'])} answer every requested tp", style="dim")
    console.print("match: named = the model's own rows; alias = another name with the same native and module "
                  "geometry; local-only = kernel tables keyed by local heads; other-geometry / native-missing = the "
                  "native bucket holds another module or is absent. via: tp1, chain (rows at this tp), sweep (tp=1 "
                  "rows at this local), local (another native's rows at this local).", style="dim")


@app.command("coverage")
@handles_errors
def coverage_command(
    paths: PathsArg = None,
    system: Annotated[str | None, typer.Option("--system", help="Only this system.")] = None,
    backend: Annotated[str | None, typer.Option("--backend", help="Only this backend.")] = None,
    version: Annotated[str | None, typer.Option("--version", help="Only this backend version.")] = None,
    table: TableOpt = None,
    diff: Annotated[tuple[str, str] | None, typer.Option(
        "--diff", metavar="V1 V2", help="What moving from version V1 to V2 gains and loses.")] = None,
    model: Annotated[str | None, typer.Option("--model", metavar="ID",
                                              help="Where this model is answerable without substitution.")] = None,
    tp: Annotated[str | None, typer.Option("--tp", help="tp sizes, e.g. 1,2,4,8 (with --model; default 1,2,4,8; "
                                           "without --model: the matrix columns shown).")] = None,
    csv_out: Annotated[bool, typer.Option("--csv", help="Print CSV (one line per cell) instead of tables.")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", metavar="FILE.png",
                                              help="Also draw a heatmap (needs the [plot] extra).",
                                              readable=False)] = None,
    data_root: DataRootOpt = None,
    model_configs: ModelConfigsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Per (system, backend, version, table): which native x tp cells are measured and with how many
    grid points; exit 0 when every table loads, 1 otherwise, 2 on usage errors."""
    if diff and model:
        raise E.OptionValueError("--diff and --model answer different questions; pass one",
                                 fix="run `modperf coverage --diff V1 V2` and `modperf coverage --model ID` separately")
    if diff and version:
        raise E.OptionValueError("--diff names both versions; --version would filter one of them away",
                                 fix="drop --version")
    if json_out and csv_out:
        raise E.OptionValueError("--json and --csv both print to stdout; pass one", fix="drop --json or --csv")
    if (diff or model) and paths:
        raise E.OptionValueError("--diff and --model read the whole data root, not PATHs",
                                 fix="point --data-root at the folder instead")
    if plot is not None and diff:
        raise E.OptionValueError("--plot draws the coverage matrix or a --model answer, not a --diff",
                                 fix="plot each version with --version V --plot FILE.png")
    tps = parse_tps(tp) if tp else None
    root = str(data_root) if data_root else None
    configs = [str(p) for p in model_configs or []]
    with progress("loading", enabled=not (json_out or csv_out)) as on_progress:
        if diff:
            result: Any = coverage_diff(diff[0], diff[1], data_root=root, system=system, backend=backend,
                                        table=table, model_configs=configs, on_progress=on_progress)
        elif model:
            result = model_coverage(model, tps or [1, 2, 4, 8], data_root=root, system=system, backend=backend,
                                    version=version, table=table, model_configs=configs, on_progress=on_progress)
        else:
            result = coverage(paths_or_none(paths), data_root=root, system=system, backend=backend, version=version,
                              table=table, model_configs=configs, on_progress=on_progress)
    if plot is not None:
        from ..audit.plot import plot_coverage, plot_model

        written = plot_model(result, plot) if model else plot_coverage(result, plot, tps)
        err_console.print(f"wrote {written}")
    if json_out:
        emit_json(result.to_dict())
    elif csv_out:
        sys.stdout.write(to_csv(result.rows()))
    elif isinstance(result, CoverageDiff):
        print_diff(result)
    elif isinstance(result, ModelCoverage):
        print_model(result)
    else:
        print_matrix(result, tps or list(STANDARD_TP))
    if not json_out and not csv_out:
        for failure in result.failures:
            console.print(f"[red]FAIL[/] [bold]{failure.kind}[/]: {escape(str(failure))}", soft_wrap=True)
    raise typer.Exit(0 if result.ok else 1)
