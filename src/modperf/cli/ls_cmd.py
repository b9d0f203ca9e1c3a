"""``modperf ls``."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ..base import errors as E
from ..data.inventory import list_tables
from ._app import app
from ._common import DataRootOpt, JsonOpt, WideOpt, console, emit_json, handles_errors, print_failure, print_table

#: The columns a narrow terminal leaves out, least important first (the slot and the table never;
#: one left out on the way comes back where it fits).
COLUMNS_DROPPED = ("rows", "note", "models")


@app.command("ls")
@handles_errors
def ls_command(
    system: Annotated[str | None, typer.Option("--system", help="Only this system (e.g. h200_sxm).")] = None,
    backend: Annotated[str | None, typer.Option("--backend", help="Only this backend (sglang, vllm, trtllm).")] = None,
    version: Annotated[str | None, typer.Option("--version", help="Only this backend version.")] = None,
    table: Annotated[str | None, typer.Option(
        "--table", help="Only this table stem (e.g. mla_context_module).")] = None,
    all_tables: Annotated[bool, typer.Option(
        "--all", help="Also list the tables without the model's attention head axis (gemm, moe, communication, "
        "...; without --all a line says how many are not listed).")] = False,
    data_root: DataRootOpt = None,
    json_out: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """List tables with rows, models and (num_heads x tp_size) pairs; exit 1 when a part of the
    data root cannot be read (an unreadable folder, a malformed reuse.yaml: listed)."""
    problems: list[E.ModperfError] = []
    entries = list_tables(str(data_root) if data_root else None, system=system, backend=backend,
                          version=version, table=table, problems=problems)
    hidden: list[dict] = []
    if not all_tables and table is None:
        hidden = [e for e in entries if not e["model_head_axis"]]
        entries = [e for e in entries if e["model_head_axis"]]
    families = sorted({str(e["family"] or e["table"]) for e in hidden})
    if json_out:
        emit_json({"tables": entries, "problems": [p.to_dict() for p in problems],
                   "hidden": {"tables": len(hidden), "families": families, "shown_with": "--all"}})
        raise typer.Exit(1 if problems else 0)
    # a slot part with one value in every row (a --system filter's) is said once, in the title
    same = [c for c in ("system", "backend", "version") if entries and len({e[c] for e in entries}) == 1]
    varying = [c for c in ("system", "backend", "version") if c not in same]
    title = f"{len(entries)} tables" + "".join(f", {c} {entries[0][c]}" for c in same)
    grid = Table(title=escape(title), show_lines=False)
    rows = []
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
        rows.append({"slot": " ".join(str(e[c]) for c in varying), "table": e["table"], "rows": str(e.get("rows")),
                     "models": models, "num_heads x tp_size": pairs, "note": "; ".join(note)})
    # the slot unless the title says it all; models and notes where a row has some
    names = [*(["slot"] if varying else []), "table", "rows",
             *(["models"] if any(r["models"] for r in rows) else []), "num_heads x tp_size",
             *(["note"] if any(r["note"] for r in rows) else [])]
    for name in names:
        grid.add_column(" ".join(varying) if name == "slot" else name, justify="right" if name == "rows" else "left",
                        no_wrap=name in ("table", "rows"))
    for r in rows:
        grid.add_row(*[escape(r[name]) for name in names])
    print_table(grid, COLUMNS_DROPPED)
    if hidden:
        console.print(f"{len(hidden)} more tables without the model's attention head axis are not listed "
                      f"({', '.join(families)}): --all lists them")
    for problem in problems:
        print_failure(problem)
    raise typer.Exit(1 if problems else 0)
