"""``modperf query``: one latency, or a batch of JSON-lines queries."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ..base import errors as E
from ..fast.cache_keys import is_digits
from ..fast.fields import option_fields
from ..query.db import Database
from ._app import app
from ._batch import answer_batch, open_batch
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


def print_answer(answer: dict[str, Any]) -> None:
    kind = answer["kind"]
    style = {"exact": "green", "interpolated": "cyan", "extrapolated": "yellow"}.get(kind, "white")
    if answer.get("substituted_from") is not None:
        # the first line is the one people copy: it says the native is not the one asked
        console.print(f"[bold]{answer['latency_ms']:.6g} ms[/]  [bold yellow]substituted (from native "
                      f"{answer['substituted_from']})[/], [{style}]{kind}[/] at that native")
        console.print(f"[bold yellow]SUBSTITUTED[/]: answered from native bucket {answer['substituted_from']}, not "
                      f"the native asked ({answer['requested_native']}): {escape(str(answer['substitution']))}")
    else:
        console.print(f"[bold]{answer['latency_ms']:.6g} ms[/]  [{style}]{kind}[/]")
    if answer.get("quality"):
        console.print(f"[bold yellow]QUALITY[/]: {len(answer['quality'])} finding(s) of `modperf check --quality` on "
                      "the measured points this answer stands on:")
        for q in answer["quality"]:
            ratio = f"{q['ratio']:,.1f}x" if q.get("ratio") is not None else "-"
            console.print(f"  {q['kind']} at {q['point']}: {q['latency']:g} ms vs {q['reference']:g} ms ({ratio})")
    grid = Table(show_header=False, box=None, pad_edge=False)
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(overflow="fold")
    f = answer["fields"]
    slot = f"{answer['system']}/{answer['backend']}/{answer['version']}/{answer['table']}"
    grid.add_row("slot", slot + (" (default version)" if answer.get("version_chosen") else ""))
    if answer["local"] >= 0:  # tables without a head axis (GEMM, MoE, communication, ...) have none
        heads = f"local {answer['local']}"
        if answer["native"] is not None:
            heads = f"native {answer['native']}, " + heads
        grid.add_row("heads", heads + f" (measured locals used: {', '.join(map(str, answer['locals_used']))})")
    key = {k: v for k, v in f.items() if k not in ("table", "system", "backend", "version")}
    grid.add_row("key", escape(", ".join(f"{k}={v}" for k, v in key.items())))
    for name, why in (answer.get("derived") or {}).items():
        grid.add_row("from the model", escape(f"{name}: {why}"))
    for name, why in (answer.get("defaults") or {}).items():
        grid.add_row("default", escape(f"{name}: {why}"))
    if answer.get("lane"):
        grid.add_row("lane", escape(f"{answer['lane']['kernel_source']}: {answer['lane']['rule']}"))
    grid.add_row("models", escape(", ".join(answer["models"]) or "-"))
    grid.add_row("files", escape("\n".join(answer["files"])))
    if answer["reused_from"]:
        grid.add_row("reuse", f"answered by version {answer['reused_from']} (reuse.yaml"
                     + (f": {escape(str(answer['reuse_reason']))})" if answer["reuse_reason"] else ")"))
    if answer["extrapolation"]:
        x = answer["extrapolation"]
        grid.add_row("extrapolation", f"{x['distance_octaves']:.3g} of {x['limit_octaves']:g} octave(s), "
                     f"{escape(x['model'])}; measured range {x['measured_range']}")
    for note in answer.get("notes") or ():
        grid.add_row("note", escape(note))
    print_table(grid)


@app.command("query", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@handles_errors
def query_command(
    ctx: typer.Context,
    table: Annotated[str | None, typer.Argument(
        help="Table stem, e.g. mla_context_module.", show_default=False)] = None,
    system: Annotated[str | None, typer.Option("--system", help="System, e.g. h200_sxm.")] = None,
    backend: Annotated[str | None, typer.Option("--backend", help="Backend: sglang, vllm, trtllm.")] = None,
    version: Annotated[str | None, typer.Option("--version", help="Backend version folder (default: the newest "
                                                "holding the model's native).")] = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="HF model id; its native heads come from its config (ORG/NAME@DTYPE: served in "
                        "other dtypes).")] = None,
    native_heads: Annotated[int | None, typer.Option(
        "--native-heads", help="Native head count (instead of --model).")] = None,
    tp: Annotated[int | None, typer.Option("--tp", help="Tensor-parallel size: local heads = native / tp.")] = None,
    num_heads: Annotated[int | None, typer.Option(
        "--num-heads", help="Rank-local heads, directly (instead of --tp).")] = None,
    allow_substitute: Annotated[bool, typer.Option(
        "--allow-substitute",
        help="Answer an unmeasured native from the nearest one (the answer says so).")] = False,
    batch: Annotated[str | None, typer.Option(
        "--batch", help="JSON-lines file of queries (- for stdin); writes one JSON line per query, in order, "
        "4,096 lines at a time (from a pipe, answers follow each 4,096 lines and the end of the input).")] = None,
    data_root: DataRootOpt = None,
    model_configs: ModelConfigsOpt = None,
    json_out: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Latency of one module shape: give the key columns as --FIELD VALUE (e.g. --batch-size 8 --isl 4096).

    With --model and --tp the keys the model fixes are derived (heads, kv heads, head_dim, window,
    op_name); --layer picks the layer kind where a model runs several on one table (e.g. --layer
    sliding). Dtypes are the deployment's choice: each defaults to the checkpoint's (or bfloat16
    where measured) and the one given wins (--gemm-type bfloat16 serves the model in it, as
    ORG/NAME@gemm=bfloat16 would).

    Exit codes: 0 answered (every line, with --batch), 1 not covered / out of coverage (or any
    batch line failed), 2 usage errors.
    """
    fields: dict[str, Any] = {"table": table, "system": system, "backend": backend, "version": version,
                              "model": model, "native_heads": native_heads, "tp_size": tp, "num_heads": num_heads}
    if allow_substitute:
        fields["allow_substitute"] = True
    extra, _ = option_fields(list(ctx.args))
    clash = sorted(set(extra) & {k for k, v in fields.items() if v is not None})
    if clash:
        raise E.QueryFieldError(f"field(s) {', '.join(clash)} given twice", values={"fields": clash},
                                fix="give each field once")
    fields.update(extra)
    fields = {k: v for k, v in fields.items() if v is not None}
    db = Database(str(data_root) if data_root else None, [str(p) for p in model_configs or []])
    if batch is not None:
        if is_digits(batch) and not os.path.lexists(batch):  # `--batch 4` meant a batch size
            raise E.QueryFieldError(
                f"--batch takes a JSON-lines file of queries, and there is no file {E.quote(batch)}",
                values={"batch": batch}, fix=f"did you mean --batch-size {batch}? (--batch FILE answers a file)")
        failed = answer_batch(db, batch, open_batch(batch), fields)
        raise typer.Exit(1 if failed else 0)
    if table is None:
        raise E.QueryFieldError("missing TABLE (or --batch FILE)", values={},
                                fix="modperf query TABLE --system S --backend B --version V ... (see --help)")
    answer = db.query(**fields).to_dict()
    if json_out:
        emit_json(answer)
    else:
        print_answer(answer)

