"""``modperf export``: a system's measured rows in one parquet or CSV file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ..audit.export import export
from ..query.db import Database
from ._app import app
from ._common import DataRootOpt, JsonOpt, ModelConfigsOpt, TableOpt, console, emit_json, handles_errors, print_failure


@app.command("export")
@handles_errors
def export_command(
    system: Annotated[str, typer.Option("--system", help="System, e.g. h200_sxm.", show_default=False)],
    out: Annotated[Path, typer.Option("--out", help="The file to write: .parquet or .csv (by its suffix).",
                                      show_default=False, readable=False)],
    table: TableOpt = None,
    backend: Annotated[str | None, typer.Option("--backend", help="Only this backend.")] = None,
    version: Annotated[str | None, typer.Option("--version", help="Only this backend version.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace --out if it exists.")] = False,
    data_root: DataRootOpt = None,
    model_configs: ModelConfigsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Write the measured rows of a system's tables (every guard applied, as queries read them)
    to one parquet or CSV file, with the columns system, backend, version, table and family in
    front; docs/queries.md, "Taking rows away".

    Exit 0 when written, 1 when a selected table fails to load (nothing is written), 2 on usage
    errors (an existing --out without --force among them)."""
    db = Database(str(data_root) if data_root else None, [str(p) for p in model_configs or []])
    result = export(db, out, system=system, table=table, backend=backend, version=version, force=force)
    if json_out:
        emit_json(result.to_dict())
    elif result.written:
        console.print(f"wrote {result.rows:,} rows of {len(result.tables)} table(s) to {escape(result.out)} "
                      f"({result.format}; columns: {escape(', '.join(result.columns))})")
    else:
        for failure in result.failures:
            print_failure(failure)
        console.print(f"[red]nothing written[/]: {len(result.failures)} of {len(result.tables)} table(s) failed to "
                      "load (narrow the selection with --backend, --version or --table to leave them out)")
    raise typer.Exit(0 if result.ok else 1)
