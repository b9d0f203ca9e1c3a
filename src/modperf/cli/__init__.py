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
from . import (  # noqa: E402,F401  (imported after app exists, for their command registration)
    check_cmd,
    coverage_cmd,
    dedupe_cmd,
    estimate_cmd,
    ls_cmd,
    migrate_cmd,
    query_cmd,
)


def main() -> None:
    app()


__all__ = ["app", "main"]
