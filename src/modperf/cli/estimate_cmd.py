"""``modperf estimate``."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ..base import errors as E
from ..model.estimate import Estimate, TpEstimate, estimate
from ..model.step import COMPONENTS, OP_KINDS, ModelEstimate, OpCost, StepCost
from ..query.db import Database
from ..specs.shard import parse_tps
from ._app import app
from ._common import (
    DataRootOpt,
    JsonOpt,
    ModelConfigsOpt,
    WideOpt,
    console,
    emit_json,
    handles_errors,
    print_table,
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
    grid.add_column("ms")
    for t in est.tps:
        grid.add_column(f"tp={t.tp}", justify="right")

    def row(label: str, cell) -> None:
        grid.add_row(escape(label), *[cell(t) for t in est.tps])

    row("local heads", lambda t: str(t.local_heads))
    labels = [(c.label, c.count, c.composed) for c in _first(est, "prefill")] or \
        [(c.label, c.count, c.composed) for c in _first(est, "decode")]
    for i, (label, count, composed) in enumerate(labels):
        tag = " (composed)" if composed else ""
        row(f"{label} x{count} prefill{tag}", lambda t, i=i: _cell(t, "prefill", i, 3))
    row("prefill total", lambda t: _total(t, "prefill", 3))
    for i, (label, count, composed) in enumerate(labels):
        tag = " (composed)" if composed else ""
        row(f"{label} x{count} decode{tag}", lambda t, i=i: _cell(t, "decode", i, 4))
    row(f"decode step (kv {est.decode_kv})", lambda t: _total(t, "decode", 4))
    if any(t.decode_mean_ms is not None for t in est.tps):
        row(f"decode mean (kv {est.isl}..{est.isl + est.osl - 1})",
            lambda t: f"{t.decode_mean_ms:.4f}" if t.decode_mean_ms is not None else "-")
    row("prefill layer queries", lambda t: _kinds(t.kinds("prefill")))
    row("decode layer queries", lambda t: _kinds(t.kinds("decode")))
    for i, (label, _, _) in enumerate(labels):
        row(f"{label} natives (prefill)", lambda t, i=i: _native(t, i))
    for i, (label, _, _) in enumerate(labels):
        row(f"{label} kernel (prefill)", lambda t, i=i: _kernel(t, "prefill", i))
        row(f"{label} kernel (decode)", lambda t, i=i: _kernel(t, "decode", i))
    print_table(grid, _tp_columns_last_first(grid))
    for t in est.tps:
        for phase, err in (("prefill", t.prefill_error), ("decode", t.decode_error)):
            if err is not None:
                console.print(f"[red]not covered[/] tp={t.tp} {phase}: {escape(str(err))}")
    for t in est.tps:
        for sub in t.substitutions:
            console.print(f"[yellow]substitution[/] tp={t.tp}: {escape(sub)}")
    console.print("versions: " + ", ".join(f"{k} {v}" for k, v in est.versions.items()), style="dim")
    for note in est.notes:
        console.print(f"note: {escape(note)}", style="dim")


def print_model_estimate(est: ModelEstimate) -> None:
    """One column per tp; rows per component of the prefill and of the decode step."""
    par = est.tps[0].parallel if est.tps else None
    extra = f", moe_ep {par.moe_ep}, attention_dp {par.attention_dp}" if par else ""
    grid = Table(title=escape(f"{est.model} on {est.system} {est.backend}: whole model per prefill and per decode "
                              f"step (batch {est.batch}, isl {est.isl}, osl {est.osl}, prefix {est.prefix}{extra})"))
    grid.add_column("ms")
    for t in est.tps:
        grid.add_column(f"tp={t.parallel.tp}", justify="right")
    unpriced = False
    for phase, label in (("prefill", "prefill"), ("decode", f"decode step (kv {est.decode_kv})")):
        for comp in COMPONENTS:
            cells = [_component(getattr(t, phase), comp) for t in est.tps]
            unpriced = unpriced or NOT_PRICED in cells
            grid.add_row(f"{phase} {comp}", *cells)
        grid.add_row(f"[bold]{escape(label)}[/]", *[_model_total(getattr(t, phase).total_ms) for t in est.tps])
        grid.add_row(f"{phase} ops by kind", *[_op_kinds(getattr(t, phase).ops) for t in est.tps])
    print_table(grid, _tp_columns_last_first(grid))
    if unpriced:
        console.print(f"{NOT_PRICED} = an op of that component could not be priced (not covered, below): the "
                      "component and the total have no value", style="dim")
    for t in est.tps:
        for phase in ("prefill", "decode"):
            for miss in getattr(t, phase).not_covered:
                console.print(f"[red]not covered[/] tp={t.parallel.tp} {phase}: {escape(miss['name'])}: "
                              f"{escape(str(miss['reason']))}")
    versions: dict[str, str] = {}
    for t in est.tps:
        versions.update(t.prefill.versions)
        versions.update(t.decode.versions)
    console.print("versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())), style="dim")
    for note in est.notes:
        console.print(f"note: {escape(note)}", style="dim")


#: A component an op of which could not be priced: no number (a sum of the rest would read as a cost).
NOT_PRICED = "—"


def _component(step: StepCost, component: str) -> str:
    if any(op.ms is None and op.component == component for op in step.ops):
        return NOT_PRICED
    return f"{step.components[component]:.4f}"


def _tp_columns_last_first(grid: Table) -> list[str]:
    """The tp columns, the last first: what a narrow terminal leaves out (the label never)."""
    return [str(c.header) for c in grid.columns[1:]][::-1]


def _model_total(value: float | None) -> str:
    return f"[bold]{value:.4f}[/]" if value is not None else "[red]partial[/]"


#: The op kinds as a narrow cell names them (the JSON has each op's kind in full).
_SHORT_KINDS = {"interpolated": "interp.", "extrapolated": "extrap.", "not_covered": "not priced"}


def _op_kinds(ops: list[OpCost]) -> str:
    counts = {k: sum(op.kind == k for op in ops) for k in OP_KINDS}
    return ", ".join(f"{n} {_SHORT_KINDS.get(k, k)}" for k, n in counts.items() if n) or "-"


def _first(est: Estimate, phase: str) -> list:
    for t in est.tps:
        costs = t.prefill if phase == "prefill" else t.decode
        if costs:
            return costs
    return []


def _costs(t: TpEstimate, phase: str) -> list:
    return t.prefill if phase == "prefill" else t.decode


def _cell(t: TpEstimate, phase: str, i: int, digits: int) -> str:
    costs = _costs(t, phase)
    return f"{costs[i].total_ms:.{digits}f}" if i < len(costs) else "[red]n/c[/]"


def _total(t: TpEstimate, phase: str, digits: int) -> str:
    value = t.prefill_ms if phase == "prefill" else t.decode_ms
    return f"[bold]{value:.{digits}f}[/]" if value is not None else "[red]not covered[/]"


def _attention(t: TpEstimate, phase: str, i: int):
    costs = _costs(t, phase)
    if i >= len(costs):
        return None
    return next((c for c in costs[i].components if c.name == "attention"), costs[i].components[0])


def _kernel(t: TpEstimate, phase: str, i: int) -> str:
    comp = _attention(t, phase, i)
    return escape(str(comp.kernel_source or "-")) if comp is not None else "-"


def _native(t: TpEstimate, i: int) -> str:
    comp = _attention(t, "prefill", i) or _attention(t, "decode", i)
    if comp is None:
        return "-"
    return "local-only" if comp.native is None else str(comp.native)


@app.command("estimate")
@handles_errors
def estimate_command(
    model: Annotated[str, typer.Option("--model", help="HF model id (its config gives the layers and natives; "
                                                       "ORG/NAME@DTYPE: served in other dtypes).")],
    system: Annotated[str, typer.Option("--system", help="GPU system, e.g. h200_sxm.")],
    backend: Annotated[str, typer.Option("--backend", help="sglang, vllm or trtllm.")],
    isl: Annotated[int, typer.Option("--isl", help="Input (prompt) tokens per sequence.")],
    osl: Annotated[int, typer.Option("--osl", help="Output tokens per sequence.")],
    batch: Annotated[int, typer.Option("--batch", help="Sequences per batch.")],
    tp: Annotated[str, typer.Option("--tp", help="Comma-separated tensor-parallel sizes.")] = "1,2,4,8",
    version: Annotated[str | None, typer.Option(
        "--version", help="Backend version (default: newest that covers the model).")] = None,
    prefix: Annotated[int, typer.Option("--prefix", help="Cached prefix tokens before the prompt.")] = 0,
    kv_cache_dtype: Annotated[str | None, typer.Option(
        "--kv-cache-dtype", help="KV cache dtype (default: bfloat16 where measured).")] = None,
    attn_dtype: Annotated[str | None, typer.Option(
        "--attn-dtype", help="GQA attention dtype (default: bfloat16 where measured).")] = None,
    mla_dtype: Annotated[str | None, typer.Option(
        "--mla-dtype", help="MLA attention dtype (default: bfloat16 where measured).")] = None,
    gemm_type: Annotated[str | None, typer.Option(
        "--gemm-type", help="Dtype the dense layers are served in, module projections included "
                            "(default: the checkpoint's); the same choice as --gemm-dtype.")] = None,
    gemm_dtype: Annotated[str | None, typer.Option(
        "--gemm-dtype", help="Dtype the dense layers are served in, as GEMM tables name it (default: the "
                             "checkpoint's); the same choice as --gemm-type.")] = None,
    moe_dtype: Annotated[str | None, typer.Option(
        "--moe-dtype", help="Dtype the routed experts are served in (scope model; default: the "
                            "checkpoint's).")] = None,
    bmm_dtype: Annotated[str | None, typer.Option("--bmm-dtype", help="MLA bmm dtype (composed MLA layers).")] = None,
    kernel_source: Annotated[list[str] | None, typer.Option(
        "--kernel-source", help="Pin a kernel: TABLE=KERNEL (repeatable).")] = None,
    decode_kv: Annotated[int | None, typer.Option("--decode-kv", help="KV length of the decode step priced "
                                                  "(default isl + osl // 2).")] = None,
    decode_mean: Annotated[bool, typer.Option("--decode-mean", help="Also the mean over every decode step.")] = False,
    allow_substitute: Annotated[bool, typer.Option(
        "--allow-substitute", help="Answer a missing native from the nearest one, flagged.")] = False,
    scope: Annotated[str, typer.Option(
        "--scope", help="model: every op of the step; attention: the attention blocks.")] = "model",
    moe_tp: Annotated[int | None, typer.Option(
        "--moe-tp", help="MoE tensor parallelism (default: tp x attention-dp / moe-ep).")] = None,
    moe_ep: Annotated[int, typer.Option("--moe-ep", help="MoE expert parallelism.")] = 1,
    attention_dp: Annotated[int, typer.Option("--attention-dp", help="Attention data-parallel ranks.")] = 1,
    data_root: DataRootOpt = None,
    model_configs: ModelConfigsOpt = None,
    json_out: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Cost of a model per prefill and per decode step at each tp: every op (--scope model, the
    default) or the attention blocks (--scope attention); docs/estimate.md.

    Dtypes are the deployment's choice: each defaults to the checkpoint's (or bfloat16 where the
    tables measured it) and the one given wins; the model is then served in it, as
    ORG/NAME@gemm=..,moe=.. (the JSON's "served" says so). A dtype no table of the estimate keys
    is refused.

    Exit 0 when every phase at every tp answered, 1 when some phase is not covered (the rest is
    printed) or nothing is, 2 on usage errors."""
    db = Database(str(data_root) if data_root else None, [str(p) for p in model_configs or []])
    dtypes = {"kv_cache_dtype": kv_cache_dtype, "attn_dtype": attn_dtype, "mla_dtype": mla_dtype,
              "gemm_type": gemm_type, "gemm_dtype": gemm_dtype, "moe_dtype": moe_dtype, "bmm_dtype": bmm_dtype}
    est = estimate(db, model=model, system=system, backend=backend, tps=parse_tps(tp), isl=isl, osl=osl, batch=batch,
                   prefix=prefix, decode_kv=decode_kv, version=version, dtypes=dtypes,
                   kernel_sources=_pins(kernel_source), decode_mean=decode_mean, allow_substitute=allow_substitute,
                   scope=scope, moe_tp=moe_tp, moe_ep=moe_ep, attention_dp=attention_dp)
    if json_out:
        emit_json(est.to_dict())
    elif isinstance(est, ModelEstimate):
        print_model_estimate(est)
    else:
        print_estimate(est)
    # a phase out of coverage at some tp: the rest is printed, and the exit code says it is partial
    raise typer.Exit(0 if est.complete else 1)
