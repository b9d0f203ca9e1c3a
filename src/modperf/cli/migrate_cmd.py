"""``modperf migrate``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ..audit.migrate import NOTHING, REFUSED, FilePlan, MigrationReport, migrate
from ..base import errors as E
from ._app import app
from ._common import JsonOpt, ModelConfigsOpt, WideOpt, console, emit_json, handles_errors, print_failure, print_table


def _heads_change(group) -> str:
    before = ",".join(map(str, group.num_heads_before)) or "(none)"
    if not group.num_heads_after:
        return before
    after = ",".join(str(group.num_heads_after[t]) for t in sorted(group.num_heads_after))
    return f"{before} -> {after}"


def _print_plan(plan: FilePlan) -> None:
    colour = {REFUSED: "red", NOTHING: "dim"}.get(plan.action, "green")
    changed = f", {plan.rows_changed:,} change" if plan.rows_changed else ""
    console.print(f"[{colour}]{plan.action:8}[/] [bold]{plan.pattern}[/] {escape(str(plan.source))} "
                  f"({plan.rows:,} rows{changed})")
    shown = [g for g in plan.groups if g.status != "rank_local" or plan.action != NOTHING]
    if shown:
        grid = Table(show_edge=False, box=None, padding=(0, 2))
        for col in ("model", "version", "rows", "native", "tp_size", "num_heads", "group"):
            grid.add_column(col, no_wrap=col not in ("model", "tp_size", "num_heads"))
        for g in shown:
            # the reason is in the refusal printed below, with the group's values
            status = f"[red]{g.status}[/]" if g.status == "refused" else g.status
            grid.add_row(escape(g.model or "-"), g.version or "-", f"{g.rows:,}", str(g.native or "-"),
                         ", ".join(map(str, g.tp_sizes)), _heads_change(g), status)
        print_table(grid, ("version", "group"))
    for column, how in plan.filled.items():
        console.print(f"    fills {column} = {escape(repr(how['value']))}: {escape(str(how['source']))}")
    if plan.target is not None and plan.action != REFUSED:
        verb = "wrote" if plan.written else "target"
        console.print(f"    {verb}: {escape(str(plan.target))}")
    for note in plan.notes:
        console.print(f"    [dim]{escape(note)}[/]")
    if plan.verification:
        checks = ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in plan.verification.items())
        console.print(f"    verified: {checks}")
    for failure in plan.refusals:
        print_failure(failure, "[red]REFUSED[/]", indent=4)


def print_report(report: MigrationReport) -> None:
    for plan in report.files:
        _print_plan(plan)
    s = report.to_dict()["summary"]
    counts = (f"{s['files']} file(s): {s['to_write']} to migrate ({s['rows_changed']:,} rows change), "
              f"{s['unchanged']} unchanged, {s['refused']} refused")
    if report.executed:
        line = f"{counts}; [green]wrote {s['written']}[/], each verified before and after the rename"
        if not report.ok:
            line += f"; [red]stopped at a failure[/] ({s['files'] - s['written']} not written)"
    elif report.ok and s["to_write"]:
        line = f"dry run: {counts}. Run again with --execute to write."
    elif not report.ok:
        line = f"[red]{counts}[/]: nothing was written" + ("" if report.execute_requested else " (dry run)")
    else:
        line = f"{counts}: nothing to do"
    console.print(line)


def _parse_fills(fills: list[str] | None) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for item in fills or []:
        column, sep, value = item.partition("=")
        if not sep or not column:
            raise E.UsageError(f"--fill expects COLUMN=VALUE, got {item!r}", fix="e.g. --fill kernel_source=default")
        parsed[column.strip()] = value
    return parsed


@app.command("migrate")
@handles_errors
def migrate_command(
    paths: Annotated[list[Path], typer.Argument(help="Table files or folders (searched recursively).",
                                                show_default=False, readable=False)],
    execute: Annotated[bool, typer.Option("--execute", help="Write the migrated tables (default: dry run).")] = False,
    model: Annotated[str | None, typer.Option(
        "--model", help="HF model id whose native head count labels tables that record no model; required for "
                        "legacy tables without num_heads (no default).", show_default=False)] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Write under this folder (in the data-root layout where the input has it); originals are kept.",
        show_default=False, readable=False)] = None,
    fill: Annotated[list[str] | None, typer.Option(
        "--fill", help="COLUMN=VALUE for a column a legacy table lacks and the corpus does not decide (repeatable).",
        show_default=False)] = None,
    model_configs: ModelConfigsOpt = None,
    json_out: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Rewrite stale (native) and legacy (no num_heads) tables to rank-local num_heads; dry run by default.

    Exit 0 when every file is migrated, already current or never migrated (sparse-kernel
    tables); 1 when a file is refused or fails verification; 2 on usage errors.
    """
    report = migrate([str(p) for p in paths], execute=execute, model=model, out=str(out) if out else None,
                     fills=_parse_fills(fill), model_configs=[str(p) for p in model_configs or []])
    if json_out:
        emit_json(report.to_dict())
    else:
        print_report(report)
    raise typer.Exit(report.exit_code)
