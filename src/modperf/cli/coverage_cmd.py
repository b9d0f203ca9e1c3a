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
    WideOpt,
    console,
    emit_json,
    err_console,
    handles_errors,
    paths_or_none,
    print_failure,
    print_table,
    progress,
)

LEGEND = ("cells: a number = grid points measured for this native at that tp (tp-chain rows, or tp=1 sweep rows "
          "at local = native/tp); a number in parentheses = answerable only through the local key (a local-only "
          "table: another native's rows at that local), not measured for this native; interp. / extrap. = no point "
          "at that local: a query interpolates between (extrapolates past) the measured locals; · = not "
          "measured; blank = tp does not divide the native. Other tp divisors: --tp, --json, --csv.")


def _cell_text(cell: Any) -> str:
    if cell is None:
        return ""
    if cell.measured:
        return f"[green]{short_count(cell.points)}[/]"
    if cell.answerable:
        if cell.points:  # another native's rows at this local (a local-only table)
            return f"[yellow]({short_count(cell.points)})[/]"
        return f"[yellow]{_SHORT_ANSWER.get(str(cell.answer), str(cell.answer))}[/]"
    return "[red]·[/]"


#: How a cell without points of its own is answered, as a narrow cell says it.
_SHORT_ANSWER = {"interpolated": "interp.", "extrapolated": "extrap."}


def _slot(ref: Any, parts: list[str]) -> str:
    version = (ref.version or "") + (f" ←{ref.reuse.from_version}" if ref.reuse else "")
    values = {"system": ref.system or "", "backend": ref.backend or "", "version": version}
    return escape(" ".join(values[p] for p in parts if values[p]))


def _varying(refs: list[Any]) -> tuple[list[str], str]:
    """The slot parts that differ between rows, and a title suffix naming the ones that do not
    (a --system filter's value is said once, not on every row)."""
    same = [p for p in ("system", "backend", "version") if refs and len({getattr(r, p) for r in refs}) == 1
            and not (p == "version" and any(r.reuse for r in refs))]
    return ([p for p in ("system", "backend", "version") if p not in same],
            "".join(f", {p} {getattr(refs[0], p)}" for p in same if getattr(refs[0], p)))


def print_matrix(report: CoverageReport, tps: list[int]) -> None:
    parts, said = _varying([s.ref for s in report.slots])
    grid = Table(title=escape(f"coverage: native x tp (local = native / tp){said}"))
    slot_header = " ".join(parts)
    if parts:
        grid.add_column(slot_header)
    grid.add_column("table", no_wrap=True)
    grid.add_column("native", justify="right", no_wrap=True)
    grid.add_column("models")
    for t in tps:
        grid.add_column(f"tp{t}", justify="right", no_wrap=True)
    grid.add_column("notes")
    lead = (lambda s: [_slot(s.ref, parts)]) if parts else (lambda s: [])
    for s in report.slots:
        if not s.ok:
            grid.add_row(*lead(s), s.ref.table, "", "", *[""] * len(tps),
                         f"[red]failed to load ({len(s.failures)} failures)[/]")
            continue
        if not s.natives:
            grid.add_row(*lead(s), s.ref.table, "-", "", *[""] * len(tps),
                         "no native recorded; locals " + ", ".join(map(str, s.locals)))
            continue
        for nc in s.natives:
            cells = [_cell_text(nc.cell(t)) if nc.native % t == 0 else "" for t in tps]
            note = (f"undeployable locals {', '.join(map(str, nc.undeployable_locals))}"
                    if nc.undeployable_locals else "")
            models = ", ".join(m.split("/")[-1] for m in nc.models)
            grid.add_row(*lead(s), s.ref.table, str(nc.native), escape(models), *cells, note)
    # a narrow terminal leaves out the models, then the widest tp columns, then the notes
    print_table(grid, ["models", *[f"tp{t}" for t in sorted(tps, reverse=True)[:3]], "notes",
                       *[f"tp{t}" for t in sorted(tps, reverse=True)[3:]]])
    console.print(LEGEND, style="dim")


def print_diff(result: CoverageDiff) -> None:
    changed = [s for s in result.slots if s.changed]
    parts = [p for p in ("system", "backend") if len({getattr(s, p) for s in changed}) != 1]
    said = "".join(f", {p} {getattr(changed[0], p)}" for p in ("system", "backend") if p not in parts and changed)
    grid = Table(title=escape(f"coverage change {result.before} → {result.after}{said}"))
    if parts:
        grid.add_column(" ".join(parts))
    for col in ("table", "status", "native", "gained tp", "lost tp", "points before → after"):
        grid.add_column(col, no_wrap=col == "table")
    for s in changed:
        lead = [escape(" ".join(getattr(s, p) for p in parts))] if parts else []
        status = {"both": "", "only_before": "[red]gone[/]", "only_after": "[green]new[/]"}[s.status]
        if not s.natives:
            gained = ", ".join(map(str, s.locals_gained))
            lost = ", ".join(map(str, s.locals_lost))
            grid.add_row(*lead, s.table, status, "-", f"locals {gained}" if gained else "",
                         f"locals {lost}" if lost else "", "")
        for nat, d in s.natives.items():
            before, after = sum(d["points_before"].values()), sum(d["points_after"].values())
            grid.add_row(*lead, s.table, status, str(nat),
                         f"[green]{', '.join(map(str, d['gained']))}[/]", f"[red]{', '.join(map(str, d['lost']))}[/]",
                         f"{before:,} → {after:,}")
    print_table(grid, ["points before → after", "native"])
    console.print(f"{len(changed)} of {len(result.slots)} (system, backend, table) changed between "
                  f"{result.before} and {result.after}; status: gone = only in {result.before}, new = only in "
                  f"{result.after}, blank = in both", style="dim")


#: How a --model cell is known, in words (Cell.via), for the legend.
VIA = ("cells: N chain / sweep / tp1 = N grid points measured for this model's native at that tp (chain: rows "
       "collected at that tp; sweep: tp=1 rows at that local; tp1: the tp=1 rows); N local = N points of "
       "another native at that local (local-only tables); interp. / extrap. = no point at that local: the "
       "query interpolates between (or extrapolates past) the measured locals; no = not answerable without "
       "substitution; n/a = tp does not divide the native.")


def _model_cell(c: Any) -> str:
    if c is None:
        return "n/a"
    if not c.answerable:
        return "[red]no[/]"
    colour = "green" if c.measured else "yellow"
    via = _SHORT_ANSWER.get(c.via, c.via)
    text = f"{short_count(c.points)} {via}" if c.points else via
    return f"[{colour}]{text}[/]"


def print_model(result: ModelCoverage) -> None:
    parts, said = _varying([a.ref for a in result.answers])
    grid = Table(title=escape(f"{result.model} (native {result.native}): answerable without substitution{said}"))
    if parts:
        grid.add_column(" ".join(parts))
    grid.add_column("table", no_wrap=True)
    grid.add_column("match")
    for t in result.tps:
        grid.add_column(f"tp{t}\nlocal {result.native // t}" if result.native % t == 0 else f"tp{t}",
                        justify="right")
    for a in result.answers:
        cells = [_model_cell(a.cells.get(t)) for t in result.tps]
        grid.add_row(*([_slot(a.ref, parts)] if parts else []), a.ref.table, a.match, *cells)
    # a narrow terminal leaves out the match, then the widest tp columns
    print_table(grid, ["match", *[str(c.header) for c in grid.columns[-len(result.tps):]][::-1][:-1]])
    summary = result.summary()
    per_tp = ", ".join(f"tp{t}: {n}" for t, n in summary["slots_answering_tp"].items())
    console.print(f"{summary['slots_considered']} slots considered; answering {per_tp}; "
                  f"{len(summary['slots_answering_every_tp'])} answer every requested tp", style="dim")
    console.print("match: named = the model's own rows; alias = another name with the same native and module "
                  "geometry; local-only = kernel tables keyed by local heads; other-geometry / native-missing = the "
                  "native bucket holds another module or is absent.", style="dim")
    console.print(VIA, style="dim")


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
    wide: WideOpt = False,
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
            print_failure(failure)
    raise typer.Exit(0 if result.ok else 1)
