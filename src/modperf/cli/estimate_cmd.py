"""``modperf estimate``."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from .. import errors as E
from ..db import Database
from ..deployment import parse_tps
from ..estimate import Estimate, TpEstimate, estimate
from . import app
from ._common import (
    DataRootOpt,
    JsonOpt,
    ModelConfigsOpt,
    console,
    emit_json,
    handles_errors,
)


def _pins(values: list[str] | None) -> dict[str, str]:
    pins = {}
    for item in values or []:
        table, sep, kernel = item.partition("=")
        if not sep or not table or not kernel:
            raise E.UsageError(f"--kernel-source takes TABLE=KERNEL, got {item!r}",
                               fix="e.g. --kernel-source mla_context_module=FLASH_ATTN")
        pins[table] = kernel
    return pins


def _kinds(counts: dict[str, int]) -> str:
    parts = [f"{n} {k[:6] if k != 'exact' else k}" for k, n in counts.items() if n]
    return ", ".join(parts) or "-"


def print_estimate(est: Estimate) -> None:
    grid = Table(title=escape(f"{est.model} on {est.system} {est.backend}: attention per prefill and per decode step "
                              f"(batch {est.batch}, isl {est.isl}, osl {est.osl}, prefix {est.prefix})"))
    grid.add_column("ms", no_wrap=True)
    for t in est.tps:
        grid.add_column(f"tp={t.tp}", justify="right", no_wrap=True)

    def row(label: str, cell) -> None:
        grid.add_row(escape(label), *[cell(t) for t in est.tps])

    row("local heads", lambda t: str(t.local_heads))
    for i, cost in enumerate(est.tps[0].prefill):
        row(f"{cost.label} x{cost.count} prefill", lambda t, i=i: f"{t.prefill[i].total_ms:.3f}")
    row("prefill total", lambda t: f"[bold]{t.prefill_ms:.3f}[/]")
    for i, cost in enumerate(est.tps[0].decode):
        row(f"{cost.label} x{cost.count} decode", lambda t, i=i: f"{t.decode[i].total_ms:.4f}")
    row(f"decode step (kv {est.decode_kv})", lambda t: f"[bold]{t.decode_ms:.4f}[/]")
    if est.tps[0].decode_mean_ms is not None:
        row(f"decode mean (kv {est.isl}..{est.isl + est.osl - 1})", lambda t: f"{t.decode_mean_ms:.4f}")
    row("prefill layer queries", lambda t: _kinds(t.kinds("prefill")))
    row("decode layer queries", lambda t: _kinds(t.kinds("decode")))
    for i, cost in enumerate(est.tps[0].prefill):
        row(f"{cost.label} natives (prefill)", lambda t, i=i: _native(t, i))
    for i, cost in enumerate(est.tps[0].prefill):
        row(f"{cost.label} kernel (prefill)",
            lambda t, i=i: escape(str(t.prefill[i].components[0].kernel_source or "-")))
        row(f"{cost.label} kernel (decode)",
            lambda t, i=i: escape(str(t.decode[i].components[0].kernel_source or "-")))
    console.print(grid)
    for t in est.tps:
        for sub in t.substitutions:
            console.print(f"[yellow]substitution[/] tp={t.tp}: {escape(sub)}", soft_wrap=True)
    console.print("versions: " + ", ".join(f"{k} {v}" for k, v in est.versions.items()), style="dim")
    for note in est.notes:
        console.print(f"note: {escape(note)}", style="dim", soft_wrap=True)


def _native(t: TpEstimate, i: int) -> str:
    comp = t.prefill[i].components[0]
    return "local-only" if comp.native is None else str(comp.native)


@app.command("estimate")
@handles_errors
def estimate_command(
    model: Annotated[str, typer.Option("--model", help="HF model id (its config gives the layers and natives).")],
    system: Annotated[str, typer.Option("--system", help="GPU system, e.g. h200_sxm.")],
    backend: Annotated[str, typer.Option("--backend", help="sglang, vllm or trtllm.")],
    isl: Annotated[int, typer.Option("--isl", help="Input (prompt) tokens per sequence.")],
    osl: Annotated[int, typer.Option("--osl", help="Output tokens per sequence.")],
    batch: Annotated[int, typer.Option("--batch", help="Sequences per batch.")],
    tp: Annotated[str, typer.Option("--tp", help="Comma-separated tensor-parallel sizes.")] = "1,2,4,8",
    version: Annotated[str | None, typer.Option(
        "--version", help="Backend version (default: newest that covers the model).")] = None,
    prefix: Annotated[int, typer.Option("--prefix", help="Cached prefix tokens before the prompt.")] = 0,
    kv_cache_dtype: Annotated[str | None, typer.Option("--kv-cache-dtype")] = None,
    attn_dtype: Annotated[str | None, typer.Option("--attn-dtype")] = None,
    mla_dtype: Annotated[str | None, typer.Option("--mla-dtype")] = None,
    gemm_type: Annotated[str | None, typer.Option("--gemm-type", help="Module projection dtype.")] = None,
    gemm_dtype: Annotated[str | None, typer.Option("--gemm-dtype", help="GQA projection GEMM dtype.")] = None,
    kernel_source: Annotated[list[str] | None, typer.Option(
        "--kernel-source", help="Pin a kernel: TABLE=KERNEL (repeatable).")] = None,
    decode_mean: Annotated[bool, typer.Option("--decode-mean", help="Also the mean over every decode step.")] = False,
    allow_substitute: Annotated[bool, typer.Option(
        "--allow-substitute", help="Answer a missing native from the nearest one, flagged.")] = False,
    data_root: DataRootOpt = None,
    model_configs: ModelConfigsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Attention cost of a model per prefill and per decode step at each tp (docs/estimate.md)."""
    db = Database(str(data_root) if data_root else None, [str(p) for p in model_configs or []])
    dtypes = {"kv_cache_dtype": kv_cache_dtype, "attn_dtype": attn_dtype, "mla_dtype": mla_dtype,
              "gemm_type": gemm_type, "gemm_dtype": gemm_dtype}
    est = estimate(db, model=model, system=system, backend=backend, tps=parse_tps(tp), isl=isl, osl=osl, batch=batch,
                   prefix=prefix, version=version, dtypes=dtypes, kernel_sources=_pins(kernel_source),
                   decode_mean=decode_mean, allow_substitute=allow_substitute)
    if json_out:
        emit_json(est.to_dict())
    else:
        print_estimate(est)
