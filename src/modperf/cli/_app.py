"""The typer application every command module registers on, and the global options."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="modperf",
    help="The performance database for LLM-inference modules: measured latency tables, whole-model step costs "
         "and serving predictions (TTFT, TPOT).",
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
    """The performance database for LLM-inference modules: measured latency tables, whole-model step costs
    and serving predictions (TTFT, TPOT)."""
    if no_cache:
        import os

        from ..fast.cache_keys import NO_CACHE_ENV

        os.environ[NO_CACHE_ENV] = "1"
