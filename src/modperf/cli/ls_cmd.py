"""``modperf ls``."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ..base import errors as E
from ..data.inventory import list_tables
from ._app import app
from ._common import DataRootOpt, JsonOpt, console, emit_json, handles_errors


@app.command("ls")
@handles_errors
def ls_command(
    system: Annotated[str | None, typer.Option("--system", help="Only this system (e.g. h200_sxm).")] = None,
    backend: Annotated[str | None, typer.Option("--backend", help="Only this backend (sglang, vllm, trtllm).")] = None,
    version: Annotated[str | None, typer.Option("--version", help="Only this backend version.")] = None,
    table: Annotated[str | None, typer.Option(
        "--table", help="Only this table stem (e.g. mla_context_module).")] = None,
    all_tables: Annotated[bool, typer.Option(
        "--all", help="Include tables without the model's attention head axis (gemm, moe, comm, ...).")] = False,
    data_root: DataRootOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List tables with rows, models and (num_heads x tp_size) pairs; exit 1 when a part of the
    data root cannot be read (an unreadable folder, a malformed reuse.yaml: listed)."""
    problems: list[E.ModperfError] = []
    entries = list_tables(str(data_root) if data_root else None, system=system, backend=backend,
                          version=version, table=table, problems=problems)
    if not all_tables and table is None:
        entries = [e for e in entries if e["model_head_axis"]]
    if json_out:
        emit_json({"tables": entries, "problems": [p.to_dict() for p in problems]})
        raise typer.Exit(1 if problems else 0)
    grid = Table(title=f"{len(entries)} tables", show_lines=False)
    for col in ("system", "backend", "version", "table", "rows", "models", "num_heads x tp_size", "note"):
        grid.add_column(col, overflow="fold")
    for e in entries:
        if e.get("head_pairs_by_model"):
            models = "\n".join(e["head_pairs_by_model"])
            pairs = "\n".join(" ".join(v) for v in e["head_pairs_by_model"].values())
        else:
            models, pairs = "", " ".join(e.get("head_pairs") or [])
        note = []
        if e["reused_from"]:
            note.append(f"reuses {e['reused_from']}")
        if e["shadowed_by_reuse"]:
            note.append("shadowed by reuse.yaml")
        misplaced = e.get("misplaced")
        if misplaced and misplaced["served_as"] and e["backend"] == misplaced["library"]:
            note.append(f"served from {misplaced['folder']}/ (misplaced)")
        elif misplaced and misplaced["recorded_versions"] and not misplaced["served_as"]:
            note.append(f"misplaced {misplaced['library']} table: not served (see `modperf check`)")
        if e.get("model_head_axis") and not e.get("has_num_heads"):
            note.append("no num_heads (legacy)")
        if e.get("error"):
            note.append(e["error"])
        grid.add_row(e["system"], e["backend"], e["version"], e["table"], str(e.get("rows")), models, pairs,
                     "; ".join(note))
    console.print(grid)
    for problem in problems:
        console.print(f"[red]FAIL[/] [bold]{problem.kind}[/]: {escape(str(problem))}", soft_wrap=True)
    raise typer.Exit(1 if problems else 0)
