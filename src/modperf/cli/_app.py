"""The typer application every command module registers on, and the global options."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="modperf",
    help="Performance database for LLM-inference attention modules, with an unambiguous head axis.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _global_options(
    no_cache: bool = typer.Option(False, "--no-cache", help="Key every table from its file; neither read nor write "
                                  "the persisted cache (MODPERF_NO_CACHE=1 does the same)."),
) -> None:
    """Performance database for LLM-inference attention modules, with an unambiguous head axis."""
    if no_cache:
        import os

        from ..cache import NO_CACHE_ENV

        os.environ[NO_CACHE_ENV] = "1"
