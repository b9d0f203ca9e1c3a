"""The ``modperf`` command line: a thin typer layer over the library."""

from __future__ import annotations

import typer
from rich.markup import escape

app = typer.Typer(
    name="modperf",
    help="Performance database for LLM-inference attention modules, with an unambiguous head axis.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each module registers its commands on ``app``.
from . import (  # noqa: E402,F401  (imported after app exists, for their command registration)
    check_cmd,
    coverage_cmd,
    dedupe_cmd,
    estimate_cmd,
    ls_cmd,
    migrate_cmd,
    predict_cmd,
    query_cmd,
)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI. A command-line error that the parser finds (an option without its value, a
    value of the wrong type) exits 2 like every usage error, and with ``--json`` it is a JSON
    error object too, so that a script sees one format whatever went wrong."""
    import sys

    from .. import errors as E
    from ..jsonio import dumps
    from ._common import err_console

    args = sys.argv[1:] if argv is None else list(argv)
    try:
        code = app(args=args, standalone_mode=False, prog_name="modperf")
    except typer.TyperException as exc:  # the parser's errors (typer's vendored click)
        if type(exc).__name__ == "NoArgsIsHelpError" or not hasattr(exc, "format_message"):
            getattr(exc, "show", lambda: None)()  # `modperf` alone: the help text
            sys.exit(exc.exit_code)
        message = E.clean(exc.format_message())
        if "--json" in args:
            error = E.UsageError(f"command line: {message}", fix="see `modperf --help` or `modperf COMMAND --help`")
            sys.stdout.write(dumps({"error": error.to_dict()}) + "\n")
        else:
            err_console.print(f"[bold red]error[/] (usage): {escape(message)}", soft_wrap=True)
            err_console.print("see `modperf --help` or `modperf COMMAND --help`", style="dim")
        code = exc.exit_code
    except typer.Abort:
        code = 1
    sys.exit(code if isinstance(code, int) else 0)


__all__ = ["app", "main"]
