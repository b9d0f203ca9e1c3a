"""``modperf dedupe``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ..audit.dedupe import DEFAULT_EXAMPLES, DEFAULT_TOLERANCE, DedupeReport, dedupe
from ._app import app
from ._audit_format import compact_key, short_label
from ._audit_format import pct as _pct
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


def print_report(report: DedupeReport) -> None:
    tol = _pct(report.tolerance)
    groups = Table(title="alias groups (names with one native and one module geometry)")
    for col in ("table", "native", "models (bold = canonical)", "shared keys", "median", "p95", "max", f"> {tol}"):
        groups.add_column(col, justify="left" if col in ("table", "models (bold = canonical)") else "right",
                          overflow="fold")
    for f in report.files:
        for g in f.alias_groups:
            names = "\n".join(f"[bold]{m}[/]" if m == g.canonical else m for m in g.models)
            s = g.spread
            groups.add_row(short_label(f.ref), str(g.native), names, f"{g.shared_keys:,}", _pct(s.median), _pct(s.p95),
                           _pct(s.max), f"[red]{s.over_tolerance}[/]" if s.over_tolerance else "0")
    if groups.row_count:
        print_table(groups, ("p95", "median", "shared keys", f"> {tol}"))
    dups = Table(title="duplicate rows (one identity measured more than once)")
    for col in ("table", "rows", "identities", "alias dup rows", "repeat rows", "repeat median", "repeat max",
                f"> {tol}"):
        dups.add_column(col, justify="left" if col == "table" else "right", overflow="fold")
    for f in report.files:
        if f.duplicate_rows:
            r = f.repeat_spread
            dups.add_row(short_label(f.ref), f"{f.rows:,}", f"{f.identities:,}", f"{f.alias_duplicate_rows:,}",
                         f"{f.repeat_rows:,}", _pct(r.median), _pct(r.max),
                         f"[red]{f.over_tolerance_keys}[/]" if f.over_tolerance_keys else "0")
    if dups.row_count:
        print_table(dups, ("alias dup rows", "repeat median", "identities", "rows"))
    worst = [(o, f) for f in report.files for o in f.over_tolerance]
    worst.sort(key=lambda of: -of[0].rel_diff)  # an infinite spread (a 0 ms row) sorts first
    if worst:
        over = Table(title=f"widest spreads over {tol} (all of them: --json)")
        for col in ("table", "kind", "key", "spread", "latencies (ms)"):
            over.add_column(col, overflow="fold")
        for o, f in worst[:5]:
            lat = "\n".join(f"{m.split('/')[-1] or '-'}: {', '.join(f'{x:g}' for x in v)}"
                            for m, v in o.latencies.items())
            over.add_row(short_label(f.ref), o.kind, compact_key(o.key), _pct(o.rel_diff), lat)
        print_table(over, ("kind",))
    written = [f for f in report.files if f.written is not None]
    if written:
        plan = Table(title=f"written to {report.out_dir}")
        for col in ("source", "rows", "rows written", "written", "destination"):
            plan.add_column(col, overflow="fold")
        for f in written:
            assert f.written is not None
            why = f.written.failures[0].kind if f.written.failures else ""
            plan.add_row(short_label(f.ref), f"{f.rows:,}", f"{f.written.rows_written:,}" if f.written.written else "-",
                         "[green]yes, verified[/]" if f.written.written else f"[red]NO ({escape(why)})[/]",
                         f.written.destination)
        print_table(plan, ("rows", "rows written"))
    for failure in report.failures:
        print_failure(failure)
    t = report.totals()
    console.print(
        f"{t['files']} tables, {t['rows']:,} rows, {t['identities']:,} identities: {t['duplicate_rows']:,} duplicate "
        f"rows ({t['alias_duplicate_rows']:,} under alias names, {t['repeat_rows']:,} repeats); "
        f"{t['files_with_aliases']} tables hold alias groups; {t['over_tolerance_keys']:,} identities spread over "
        f"{tol}; {report.seconds:.1f} s"
        + ("" if report.ok else f": [red]{t['files_failed']} table(s) failed[/]"))
    console.print("identity = table, native (+ module geometry), categorical keys, num_heads, axes; "
                  "spread = max/min - 1 between measurements of one identity; "
                  "canonical = most identities, most rows, shortest id, alphabetical (--prefer overrides)", style="dim")


@app.command("dedupe")
@handles_errors
def dedupe_command(
    paths: PathsArg = None,
    table: TableOpt = None,
    write: Annotated[Path | None, typer.Option("--write", metavar="OUT_DIR",
                                               help="Write de-duplicated, verified tables under OUT_DIR.",
                                               readable=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="With --write: also replace files in OUT_DIR that modperf "
                                        "did not write.")] = False,
    tolerance: Annotated[float, typer.Option("--tolerance", help="Relative spread (max/min - 1) above which an "
                                             "identity is listed.")] = DEFAULT_TOLERANCE,
    prefer: Annotated[list[str] | None, typer.Option("--prefer", metavar="MODEL", help="Canonical name to use when it "
                                                     "is in an alias group (repeatable, first wins).")] = None,
    examples: Annotated[int, typer.Option(
        "--examples", help="Over-tolerance identities listed per table, widest first (0 = all).")] = DEFAULT_EXAMPLES,
    data_root: DataRootOpt = None,
    model_configs: ModelConfigsOpt = None,
    json_out: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Alias groups, duplicate rows and the spread between measurements of one identity, per table;
    exit 0 when every table loads (and every write verifies), 1 otherwise, 2 on usage errors."""
    with progress("auditing", enabled=not json_out) as on_progress:
        report = dedupe(
            paths_or_none(paths), data_root=str(data_root) if data_root else None, table=table,
            model_configs=[str(p) for p in model_configs or []], tolerance=tolerance, prefer=prefer or (),
            examples=examples, write=write, force=force, on_progress=on_progress)
    if json_out:
        emit_json(report.to_dict())
    else:
        print_report(report)
    raise typer.Exit(0 if report.ok else 1)
