"""What every command shares: consoles, options, JSON output and error handling.

Commands only parse arguments, call the library and print; any ModperfError becomes a clear
message (or a JSON ``{"error": ...}`` object) and the error's exit code, never a traceback.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape

from .. import errors as E

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

DataRootOpt = Annotated[
    Path | None,
    typer.Option("--data-root", envvar="MODPERF_DATA_ROOT", help="Data root (default: the embedded corpus).",
                 show_default=False),
]
ModelConfigsOpt = Annotated[
    list[Path] | None,
    typer.Option("--model-configs", help="Extra folder of org--Name_config.json files (repeatable; "
                 "MODPERF_MODEL_CONFIGS also works).", show_default=False),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
PathsArg = Annotated[
    list[Path] | None,
    typer.Argument(help="Table files or folders (default: the whole data root).", show_default=False),
]
TableOpt = Annotated[str | None, typer.Option("--table", help="Only this table stem (e.g. mla_context_module).")]


def _default(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def dumps(obj: Any, **kwargs: Any) -> str:
    return json.dumps(obj, default=_default, **kwargs)


def emit_json(obj: Any) -> None:
    sys.stdout.write(dumps(obj, indent=2) + "\n")


F = TypeVar("F", bound=Callable[..., Any])


def handles_errors(fn: F) -> F:
    """Turn ModperfError into a message and its exit code; with ``--json`` print it as JSON."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except E.ModperfError as exc:
            if kwargs.get("json_out"):
                sys.stdout.write(dumps({"error": exc.to_dict()}) + "\n")
            else:
                err_console.print(f"[bold red]error[/] ({exc.kind}): {escape(str(exc))}", soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:  # a bug: say so plainly, no traceback unless asked for
            if os.environ.get("MODPERF_DEBUG"):
                raise
            err_console.print(
                f"[bold red]internal error[/]: {type(exc).__name__}: {escape(str(exc))} "
                "(set MODPERF_DEBUG=1 for the traceback, and please report it)", soft_wrap=True)
            raise typer.Exit(3) from None

    return wrapper  # type: ignore[return-value]


def paths_or_none(paths: list[Path] | None) -> list[str] | None:
    return [str(p) for p in paths] if paths else None
