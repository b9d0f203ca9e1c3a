"""The ``modperf`` command line: a thin typer layer over the library."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="modperf",
    help="Performance database for LLM-inference attention modules, with an unambiguous head axis.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each module registers its commands on ``app``.
from . import check_cmd, ls_cmd  # noqa: E402,F401
from . import coverage_cmd, dedupe_cmd  # noqa: E402,F401  (audit commands, issue 5)


def main() -> None:
    app()


__all__ = ["app", "main"]
