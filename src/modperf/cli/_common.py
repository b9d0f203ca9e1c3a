"""What every command shares: consoles, options, JSON output and error handling.

Commands only parse arguments, call the library and print; any ModperfError becomes a clear
message (or a JSON ``{"error": ...}`` object) and the error's exit code, never a traceback.
"""

from __future__ import annotations

import functools
import os
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

from ..base import errors as E
from ..base.jsonio import dumps


def _safe_text(text: str) -> str:
    # line breaks and tabs are layout; every other control character is shown as its escape
    if text.isprintable() or all(ch.isprintable() or ch in "\n\t" for ch in text):
        return text
    return "\n".join(E.escape_controls(part) for part in text.split("\n"))


class SafeConsole(Console):
    """A console that never writes a control character it did not make itself: text from
    tables, configs and the command line (a model name holding ESC[2J) is shown escaped.
    Rich's own styling and cursor control are segments of their own and pass unchanged."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:  # rich's private hook
        return super()._render_buffer(
            seg if seg.control else Segment(_safe_text(seg.text), seg.style, seg.control) for seg in buffer)


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


#: Width of output that is not going to a terminal (a file, a pipe, a test runner): wide enough
#: that no table is cut or folded; columns take their natural width.
UNBOUNDED_WIDTH = 100_000


def fit_width() -> None:
    """Terminals get their own width; anything else gets tables at full width, never cut."""
    for c in (console, err_console):
        c.width = None if c.is_terminal else UNBOUNDED_WIDTH  # type: ignore[assignment]  # rich: None = auto-detect


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
        fit_width()
        try:
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


def report_error(exc: Exception, json_out: bool) -> int:
    """A command's error as :func:`handles_errors` reports it (a ModperfError as its message,
    or with ``json_out`` as JSON; anything else as an internal error); its exit code."""
    if isinstance(exc, E.ModperfError):
        if json_out:
            sys.stdout.write(dumps({"error": exc.to_dict()}) + "\n")
        else:
            err_console.print(f"[bold red]error[/] ({exc.kind}): {escape(str(exc))}", soft_wrap=True)
        return exc.exit_code
    err_console.print(
        f"[bold red]internal error[/]: {type(exc).__name__}: {escape(str(exc))} "
        "(set MODPERF_DEBUG=1 for the traceback, and please report it)", soft_wrap=True)
    return 3


def paths_or_none(paths: list[Path] | None) -> list[str] | None:
    return [str(p) for p in paths] if paths else None
