"""``modperf cache info|clear``: the persisted cache (modperf.data.cache_info)."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from ..data import cache_info as cache
from ..fast.cache_keys import CACHE_DIR_ENV
from ._app import app
from ._common import JsonOpt, WideOpt, console, emit_json, handles_errors, print_table

cache_app = typer.Typer(help="The persisted cache of keyed tables (and catalog scans): list or clear it.",
                        no_args_is_help=True)
app.add_typer(cache_app, name="cache")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


@cache_app.command("info")
@handles_errors
def info_command(json_out: JsonOpt = False, wide: WideOpt = False) -> None:
    """Where the cache is, whether it is used (and why not), its entries (the table file each keys) and their bytes."""
    found = cache.info()
    if json_out:
        emit_json(found.to_dict())
        return
    state = "on" if found.enabled else f"off: {found.off_reason}"
    console.print(f"cache: {escape(str(found.location))} ({escape(state)}; set {CACHE_DIR_ENV} to move it)")
    if found.trust_problem is not None:
        console.print("not read, written or listed: only a folder tree that is yours and that no one else can write is "
                      "used (docs/limits.md)")
        for note in found.notes:
            console.print(f"note: {escape(note)}", style="dim")
        return
    grid = Table(title=f"{len(found.entries)} entries, {_size(found.bytes)}")
    for col in ("bytes", "rows", "table file", "entry"):
        grid.add_column(col, overflow="fold")
    for e in found.entries:
        grid.add_row(_size(e.bytes), "-" if e.rows is None else str(e.rows), escape(e.source or "(not an entry)"),
                     escape(e.file.name))
    print_table(grid, ("rows", "entry"))
    if found.grids:
        console.print(f"{found.grids} grid file(s) beside the entries ({_size(found.grid_bytes)})")
    if found.plans:
        console.print(f"{found.plans} query plan(s) ({_size(found.plan_bytes)}, with what they depend on)")
    if found.catalogs:
        console.print(f"{len(found.catalogs)} catalog scan(s) remembered "
                      f"({_size(sum(r.bytes for r in found.catalogs))}): "
                      + ", ".join(escape(r.root or "(not a record)") for r in found.catalogs))
    for note in found.notes:
        console.print(f"note: {escape(note)}", style="dim")


@cache_app.command("clear")
@handles_errors
def clear_command(json_out: JsonOpt = False) -> None:
    """Remove every entry, grid file, query plan and catalog scan (each is made again when a query needs it)."""
    removed = cache.clear()
    if json_out:
        emit_json({"location": str(removed.location), "removed": len(removed.entries), "bytes": removed.bytes,
                   "catalogs_removed": len(removed.catalogs), "grids_removed": removed.grids,
                   "grid_bytes_removed": removed.grid_bytes, "plans_removed": removed.plans,
                   "plan_bytes_removed": removed.plan_bytes})
        return
    console.print(f"removed {len(removed.entries)} entries ({_size(removed.bytes)}), {removed.grids} grid file(s) "
                  f"({_size(removed.grid_bytes)}), {removed.plans} query plan(s) ({_size(removed.plan_bytes)}) and "
                  f"{len(removed.catalogs)} catalog scan(s) from "
                  f"{escape(str(removed.location))}")
