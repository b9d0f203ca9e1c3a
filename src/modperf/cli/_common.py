"""What every command shares: consoles, options, JSON output and error handling.

Commands only parse arguments, call the library and print; any ModperfError becomes a clear
message (or a JSON ``{"error": ...}`` object) and the error's exit code, never a traceback.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar, cast

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.segment import Segment
from rich.table import Table

from ..base import errors as E
from ..base.jsonio import dumps
from ..fast.cache_keys import is_digits


def _safe_text(text: str) -> str:
    # line breaks and tabs are layout; every other control character is shown as its escape
    if text.isprintable() or all(ch.isprintable() or ch in "\n\t" for ch in text):
        return text
    return "\n".join(E.escape_controls(part) for part in text.split("\n"))


#: Spaces at the end of a line (before the styles that close it, when output is coloured).
_TRAILING = re.compile(r" +((?:\x1b\[[0-9;]*m)*)(?=\n|$)")


class SafeConsole(Console):
    """A console that never writes a control character it did not make itself: text from
    tables, configs and the command line (a model name holding ESC[2J) is shown escaped.
    Rich's own styling and cursor control are segments of their own and pass unchanged."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:  # rich's private hook
        text = super()._render_buffer(
            seg if seg.control else Segment(_safe_text(seg.text), seg.style, seg.control) for seg in buffer)
        # a table's cells and a centred title are padded with spaces to their width: a file or a
        # pipe gets every line without them (a terminal shows nothing there either way)
        return text if self.is_terminal else _TRAILING.sub(r"\1", text)


console = SafeConsole(highlight=False)
err_console = SafeConsole(stderr=True, highlight=False)

DataRootOpt = Annotated[
    Path | None,
    typer.Option("--data-root", envvar="MODPERF_DATA_ROOT", help="Data root (default: the embedded corpus).",
                 show_default=False, readable=False),
]
ModelConfigsOpt = Annotated[
    list[Path] | None,
    typer.Option("--model-configs", help="Extra folder of org--Name_config.json files (repeatable; "
                 "MODPERF_MODEL_CONFIGS also works).", show_default=False, readable=False),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
PathsArg = Annotated[
    list[Path] | None,
    typer.Argument(help="Table files or folders (default: the whole data root).", show_default=False,
                   readable=False),
]
TableOpt = Annotated[str | None, typer.Option("--table", help="Only this table stem (e.g. mla_context_module).")]


def emit_json(obj: Any) -> None:
    sys.stdout.write(dumps(obj, indent=2) + "\n")


#: Width of output that reaches no terminal and has no COLUMNS (a file or pipe of a script, a
#: test runner), and of every output under ``--wide``: tables at their natural width, never cut.
UNBOUNDED_WIDTH = 100_000
#: The narrowest width honoured (a COLUMNS below it is taken as this).
MIN_WIDTH = 20


def output_width() -> int | None:
    """The width human output is laid out for: ``COLUMNS`` when set, else the width of the
    terminal stdout or stderr is (``modperf ls | less`` gets the terminal's), else None (no
    terminal: unbounded)."""
    env = os.environ.get("COLUMNS", "").strip()
    if env.isascii() and env.isdigit() and int(env) > 0:
        return max(int(env), MIN_WIDTH)
    for stream in (console.file, err_console.file):
        try:
            if stream.isatty():
                return max(os.get_terminal_size(stream.fileno()).columns, MIN_WIDTH)
        except (AttributeError, OSError, ValueError):
            continue
    return None


def fit_width(wide: bool = False) -> None:
    """Lay output out for :func:`output_width` (``--wide``: unbounded, every table whole)."""
    width = None if wide else output_width()
    for c in (console, err_console):
        c.width = UNBOUNDED_WIDTH if width is None else width


WideOpt = Annotated[bool, typer.Option(
    "--wide", help="Print tables whole, at their natural width, whatever the terminal's (default: fit the "
    "terminal, wrapping cells and leaving out the least important columns, which a line names).")]


def _measure(table: Table, width: int) -> tuple[list[int], list[int], list[int]]:
    """Per column of ``table``: the narrowest width it can take (its longest word; a no-wrap
    column its whole text), its natural width (both with padding), and its padding."""
    from rich.measure import Measurement

    options = console.options.update_width(width)
    mins, maxs, pads = [], [], []
    for column in table.columns:
        pad = table._get_padding_width(column._index)  # rich's own accounting of a column's padding
        cells: list[Measurement] = [
            Measurement.get(console, options, cell.renderable)
            for cell in table._get_cells(console, column._index, column)]
        low = max((m.minimum for m in cells), default=1)
        high = max((m.maximum for m in cells), default=1)
        mins.append(high if column.no_wrap else low)
        maxs.append(high)
        pads.append(pad)
    return mins, maxs, pads


def _without(table: Table, drop: set[int]) -> Table:
    import copy
    import dataclasses

    out = copy.copy(table)
    kept = [c for i, c in enumerate(table.columns) if i not in drop]
    out.columns = [dataclasses.replace(c, _index=i) for i, c in enumerate(kept)]
    return out


def fit_table(table: Table, drop: Iterable[str] = (), width: int | None = None) -> tuple[Table, list[str]]:
    """``table`` laid out to ``width`` (the console's): cells wrap at word boundaries, each
    column taking its share above its longest word; where even that is too wide, the columns
    named in ``drop`` (headers, least important first) are left out one by one. The label
    column is never in ``drop``. Returns the table to print and the headers left out."""
    width = console.width if width is None else width
    if width >= UNBOUNDED_WIDTH:
        return table, []
    order = list(drop)
    headers = [str(c.header) for c in table.columns]

    def layout(left_out: list[str]) -> tuple[Table, list[int], list[int], list[int], int]:
        current = _without(table, {headers.index(h) for h in left_out}) if left_out else table
        mins, maxs, pads = _measure(current, width)
        return current, mins, maxs, pads, width - current._extra_width

    dropped: list[str] = []
    current, mins, maxs, pads, room = layout(dropped)
    if sum(maxs) <= room:
        return current, dropped
    while sum(mins) > room and order:
        dropped.append(order.pop(0))
        current, mins, maxs, pads, room = layout(dropped)
    # a column left out on the way that fits beside the rest comes back, the most important first
    # (and only while each does: what is shown stays a prefix of the stated order)
    for header in list(reversed(dropped[:-1])):
        trial = [h for h in dropped if h != header]
        candidate = layout(trial)
        if sum(candidate[1]) > candidate[4]:
            break
        dropped = trial
        current, mins, maxs, pads, room = candidate
    if sum(maxs) <= room:
        return current, [h for h in headers if h in dropped]
    if sum(mins) > room:
        # nothing more may be left out: the wrapping columns fold inside words (never the no-wrap
        # ones, the label among them, which would be cut)
        mins = [mn if column.no_wrap else min(mn, 4 + pad) for mn, column, pad in zip(mins, current.columns, pads)]
    # the label column (the first) keeps its natural width where the others can give way
    fixed_label = mins[0] < maxs[0] and maxs[0] + sum(mins[1:]) <= room
    if fixed_label:
        mins = [maxs[0], *mins[1:]]
    widths = _share(mins, maxs, room)
    for column, w, pad in zip(current.columns, widths, pads):
        column.width = max(1, w - pad)
        if not column.no_wrap and column.overflow == "ellipsis":
            column.overflow = "fold"  # a word longer than the narrowest layout folds, never "…"
    return current, [h for h in headers if h in dropped]


def _share(mins: list[int], maxs: list[int], room: int) -> list[int]:
    """Column widths summing to at most ``room``: each at least its minimum, the widest cut
    to a common level first (water-filling), what is left given to the widest."""
    low, high = 0, max(maxs)
    while low < high:
        level = (low + high + 1) // 2
        if sum(min(mx, max(mn, level)) for mn, mx in zip(mins, maxs)) <= room:
            low = level
        else:
            high = level - 1
    widths = [min(mx, max(mn, low)) for mn, mx in zip(mins, maxs)]
    spare = room - sum(widths)
    for i in sorted(range(len(widths)), key=lambda i: -maxs[i]):
        give = max(0, min(spare, maxs[i] - widths[i]))
        widths[i] += give
        spare -= give
    return widths


def print_table(table: Table, drop: Iterable[str] = ()) -> None:
    """Print ``table`` fitted to the output (:func:`fit_table`); a line names the columns left
    out and how to see them."""
    fitted, dropped = fit_table(table, drop)
    console.print(fitted)
    if dropped:
        console.print(f"not shown at {console.width} columns: {', '.join(h.replace(chr(10), ' ') for h in dropped)} "
                      "(--wide prints every column; --json holds everything)", style="dim")


@contextmanager
def progress(label: str, *, enabled: bool) -> Iterator[Callable[[int, int, Any], None]]:
    """A transient progress bar on stderr (only for a terminal, and only when ``enabled``);
    yields the ``on_progress(done, total, item)`` callback the library functions take. An
    item with a ``label`` or a ``ref.label`` is shown beside the bar."""
    bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.description}"), console=err_console, transient=True,
                   disable=not (enabled and err_console.is_terminal))
    with bar:
        task = bar.add_task("", total=None)

        def update(done: int, total: int, item: Any = None) -> None:
            ref = getattr(item, "ref", item)
            bar.update(task, completed=done, total=total, description=str(getattr(ref, "label", "") or ""))

        yield update


F = TypeVar("F", bound=Callable[..., Any])


def handles_errors(fn: F) -> F:
    """Turn ModperfError into a message and its exit code; with ``--json`` print it as JSON."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        fit_width(bool(kwargs.get("wide")))
        try:
            if kwargs.get("wide"):
                refuse_wide_without_tables(kwargs)
            return fn(*args, **kwargs)
        except E.ModperfError as exc:
            raise typer.Exit(report_error(exc, bool(kwargs.get("json_out")))) from None
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:  # a bug: say so plainly, no traceback unless asked for
            if os.environ.get("MODPERF_DEBUG"):
                raise
            raise typer.Exit(report_error(exc, False)) from None

    return cast(F, wrapper)


def refuse_wide_without_tables(options: dict[str, Any]) -> None:
    """``--wide`` lays tables out: with an output that has none (``--json``, ``--csv``, a batch
    file's JSON lines) it would change nothing, so it is refused rather than ignored."""
    batch = options.get("batch")
    without = [flag for flag, given in (("--json", options.get("json_out")), ("--csv", options.get("csv_out")),
                                        ("--batch FILE", isinstance(batch, str) and not is_digits(batch.strip())))
               if given]
    if without:
        raise E.UsageError(f"--wide lays out tables, and {without[0]} prints none", values={"wide": True},
                           fix=f"drop --wide or {without[0]}")


def report_error(exc: Exception, json_out: bool) -> int:
    """A command's error as :func:`handles_errors` reports it (a ModperfError as its message,
    or with ``json_out`` as JSON; anything else as an internal error); its exit code."""
    if isinstance(exc, E.ModperfError):
        if json_out:
            sys.stdout.write(dumps({"error": exc.to_dict()}) + "\n")
        else:
            err_console.print(f"[bold red]error[/] ({exc.kind}): {escape(str(exc))}")
        return exc.exit_code
    err_console.print(
        f"[bold red]internal error[/]: {type(exc).__name__}: {escape(str(exc))} "
        "(set MODPERF_DEBUG=1 for the traceback, and please report it)")
    return 3


def print_failure(failure: E.ModperfError, label: str = "[red]FAIL[/]", indent: int = 0, note: str = "") -> None:
    """A failure in a report: ``FAIL kind:``, the file on a line of its own (a path is read and
    copied whole), then what is wrong and the fix, indented and wrapped at the output's width;
    ``note`` (plain text) follows the kind."""
    from rich.padding import Padding

    head = f"{' ' * indent}{label} [bold]{failure.kind}[/]{escape(note)}"
    text = str(failure)
    if failure.file and text.startswith(failure.file + ": "):
        console.print(f"{head}:")
        console.print(escape(failure.file))  # whole on a line of its own (folded only where wider than the output)
        console.print(Padding(escape(text[len(failure.file) + 2:]), (0, 0, 0, indent + 4), expand=False))
    else:
        console.print(f"{head}: {escape(text)}")


def paths_or_none(paths: list[Path] | None) -> list[str] | None:
    return [str(p) for p in paths] if paths else None
