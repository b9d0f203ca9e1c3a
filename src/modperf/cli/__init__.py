"""The ``modperf`` command line: a thin typer layer over the library.

A run imports only the module of the command it runs (``modperf query`` never imports the
audits, plotting or migration); ``modperf --help``, an unknown command, and ``modperf.cli.app``
(the full application, for tests and embedding) import every command module.

May import: typer, rich, click; modperf.base, modperf.fast, modperf.specs, modperf.data, modperf.query,
modperf.audit, modperf.model, modperf.serving, modperf.search.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False
if TYPE_CHECKING:  # (typing costs a cold process ~5 ms: annotations only)
    from typing import Any

    import typer

#: Command name -> the module that registers it.
COMMANDS = {
    "check": "check_cmd", "coverage": "coverage_cmd", "dedupe": "dedupe_cmd", "estimate": "estimate_cmd",
    "ls": "ls_cmd", "migrate": "migrate_cmd", "predict": "predict_cmd", "query": "query_cmd",
    "cache": "cache_cmd", "export": "export_cmd", "search": "search_cmd",
}
#: Options taken before the command name (the application's own).
_GLOBAL_FLAGS = ("--no-cache",)


def _load(names: Any) -> typer.Typer:
    for name in names:
        importlib.import_module(f"{__name__}.{COMMANDS[name]}")
    from ._app import app

    return app


def full_app() -> typer.Typer:
    """The application with every command registered."""
    return _load(COMMANDS)


def _app_for(args: list[str]) -> typer.Typer:
    """The application with the command ``args`` names registered (every command when they name
    none or one that does not exist: the help and the error list them all)."""
    for arg in args:
        if arg in _GLOBAL_FLAGS:
            continue
        return _load([arg] if arg in COMMANDS else COMMANDS)
    return _load(COMMANDS)


def __getattr__(name: str) -> Any:
    if name == "app":
        return full_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def hoist_global_flags(args: list[str]) -> list[str]:
    """``args`` with the application's own flags (``--no-cache``) moved before the command, so
    that ``modperf query --no-cache ...`` means what ``modperf --no-cache query ...`` does (the
    parser takes them only there). Tokens after ``--`` are left alone."""
    end = args.index("--") if "--" in args else len(args)
    flags = [a for a in args[:end] if a in _GLOBAL_FLAGS]
    if not flags:
        return args
    return [*dict.fromkeys(flags), *(a for a in args[:end] if a not in _GLOBAL_FLAGS), *args[end:]]


def main(argv: list[str] | None = None) -> None:
    """Run the CLI. A command-line error that the parser finds (an option without its value, a
    value of the wrong type) exits 2 like every usage error, and with ``--json`` it is a JSON
    error object too, so that a script sees one format whatever went wrong."""
    import sys

    args = hoist_global_flags(sys.argv[1:] if argv is None else list(argv))
    from ._single import run_alone as run_single

    code = run_single(args)  # `modperf query TABLE ... --json` from a persisted plan, without the parser
    if code is None:
        from ._batch import run_alone

        code = run_alone(args)  # `modperf query --batch FILE` alone: started without the parser
    if code is not None:
        sys.exit(code)
    import typer

    app = _app_for(args)
    try:
        code = app(args=args, standalone_mode=False, prog_name="modperf")
    except typer.TyperException as exc:  # the parser's errors (typer's vendored click)
        if type(exc).__name__ == "NoArgsIsHelpError" or not hasattr(exc, "format_message"):
            getattr(exc, "show", lambda: None)()  # `modperf` alone: the help text
            sys.exit(exc.exit_code)
        from rich.markup import escape

        from ..base import errors as E
        from ..base.jsonio import dumps
        from ._common import err_console, fit_width

        fit_width()

        message = E.clean(exc.format_message())
        if "--json" in args:
            error = E.UsageError(f"command line: {message}", fix="see `modperf --help` or `modperf COMMAND --help`")
            sys.stdout.write(dumps({"error": error.to_dict()}) + "\n")
        else:
            err_console.print(f"[bold red]error[/] (usage): {escape(message)}")
            err_console.print("see `modperf --help` or `modperf COMMAND --help`", style="dim")
        code = exc.exit_code
    except typer.Abort:
        code = 1
    sys.exit(code if isinstance(code, int) else 0)


__all__ = ["COMMANDS", "app", "full_app", "main"]
