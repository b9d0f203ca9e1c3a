"""``modperf predict``: TTFT and TPOT of a deployment, or of JSON lines of them."""

from __future__ import annotations

import math
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ..base import errors as E
from ..base.jsonio import dumps
from ..fast.batch import error_line, read_lines, run_chunks
from ..model.tables import check_version
from ..query.db import Database
from ..serving.percentiles import percentiles as simulate_percentiles
from ..serving.predict import (
    DEPLOYMENT_EXAMPLE,
    Deployment,
    Prediction,
    constants_for,
    deployment_from_row,
    price,
    solve,
)
from ..specs.shard import parse_tps
from ._app import app
from ._batch import open_batch, write_answers
from ._common import DataRootOpt, JsonOpt, ModelConfigsOpt, WideOpt, console, emit_json, handles_errors, print_table

#: What a batch line is, in a malformed line's fix.
_LINE_FIX = f"one deployment per line: a JSON object of silicon_sample.csv columns, e.g. {DEPLOYMENT_EXAMPLE}"


def _opt(name: str, help_text: str) -> Any:
    return typer.Option(name, help=help_text, show_default=False)


def print_prediction(p: Prediction) -> None:
    d = p.deployment
    head = Table(title=escape(f"{d.model} on {d.system} {d.backend} ({d.mode}, isl {d.isl}, osl {d.osl})"),
                 show_header=False)
    head.add_column("")
    head.add_column("", justify="right", no_wrap=True)
    head.add_row("TTFT ms", f"[bold]{p.ttft_ms:.1f}[/]" if p.ttft_ms is not None else "not answered")
    head.add_row("TPOT ms", f"[bold]{p.tpot_ms:.2f}[/]")
    head.add_row("tokens/s per user", f"{p.tokens_per_s_per_user:.1f}")
    head.add_row("tokens/s per GPU", f"{p.tokens_per_s_per_gpu:.1f}" if p.tokens_per_s_per_gpu is not None
                 else "not answered")
    head.add_row("GPUs", str(p.gpus) if p.gpus is not None else "not given")
    for name in ("requests_per_s_per_rank", "prefill_utilisation", "queue_ms", "admission_wait_ms",
                 "kv_transfer_ms"):
        if name in p.serving:
            head.add_row(name.replace("_", " "), f"{p.serving[name]:.3f}")
    if "capacity_bound" in p.serving:
        head.add_row("prefill capacity decides TTFT", "yes" if p.serving["capacity_bound"] else "no")
    print_table(head)
    steps = Table(title="engine steps (ms)")
    steps.add_column("step", no_wrap=True)
    steps.add_column("ms", justify="right", no_wrap=True)
    steps.add_column("shape")
    for name, step in p.steps.items():
        shape = ", ".join(f"{k} {v}" for k, v in step.items() if k not in ("ms", "components"))
        steps.add_row(name, f"{step['ms']:.3f}", escape(shape))
    print_table(steps)
    decode = p.steps.get("decode", {}).get("components") or {}
    if decode:
        console.print("decode step by component: " + ", ".join(f"{k} {v:.3f}" for k, v in decode.items()),
                      style="dim")
    prov = p.provenance
    console.print("versions: " + ", ".join(f"{t} {v}" for t, v in prov["versions"].items()), style="dim")
    console.print("ops by kind: " + ", ".join(f"{n} {k}" for k, n in prov["kinds"].items()), style="dim")
    console.print(f"constants: {escape(p.serving['constants']['source'])}", style="dim")
    if "ttft_reason" in p.serving:
        console.print(f"TTFT not answered: {escape(p.serving['ttft_reason'])}", style="dim")
    for note in p.notes:
        console.print(f"note: {escape(note)}", style="dim")


def print_predictions(tps: list[Any], results: list[Prediction | E.ModperfError]) -> None:
    """One column per tp (``--tp 1,2,4,8``); a tp that could not be predicted says why below."""
    first = next((r for r in results if isinstance(r, Prediction)), None)
    title = "predict"
    if first is not None:
        d = first.deployment
        batch = d.pool.batch if d.pool else "-"
        title = f"{d.model} on {d.system} {d.backend} ({d.mode}, isl {d.isl}, osl {d.osl}, batch {batch})"
    grid = Table(title=escape(title))
    grid.add_column("")
    for t in tps:
        grid.add_column(f"tp={t}", justify="right", no_wrap=True)
    rows = (("TTFT ms", lambda p: f"[bold]{p.ttft_ms:.1f}[/]" if p.ttft_ms is not None else "—"),
            ("TPOT ms", lambda p: f"[bold]{p.tpot_ms:.2f}[/]"),
            ("tokens/s per user", lambda p: f"{p.tokens_per_s_per_user:.1f}"),
            ("tokens/s per GPU", lambda p: f"{p.tokens_per_s_per_gpu:.1f}"), ("GPUs", lambda p: str(p.gpus)))
    for label, cell in rows:
        grid.add_row(label, *[cell(r) if isinstance(r, Prediction) else "—" for r in results])
    print_table(grid, [f"tp={t}" for t in tps][::-1])
    for t, r in zip(tps, results):
        if isinstance(r, E.ModperfError):
            console.print(f"[red]not predicted[/] tp={t}: ({r.kind}) {escape(str(r))}")
    notes: list[str] = []
    for r in results:
        if isinstance(r, Prediction):
            notes += [n for n in r.notes if n not in notes]
    if first is not None:
        console.print(f"constants: {escape(first.serving['constants']['source'])}", style="dim")
    for note in notes:
        console.print(f"note: {escape(note)}", style="dim")
    console.print("each tp's steps, versions and op kinds: --json, or one --tp at a time", style="dim")


def print_percentiles(doc: dict[str, Any], tp: Any = None) -> None:
    """The simulation's answer (modperf.percentiles): a table of p50 / p90 / p99 / mean."""
    at = f"tp={tp}, " if tp is not None else ""
    if doc["loop"] == "closed":
        title = f"simulated: {at}closed loop, concurrency {doc['concurrency']}, {doc['requests']:,} requests"
    else:
        title = (f"simulated: {at}open loop, {doc['request_rate_per_s']:g} requests/s, {doc['requests']:,} "
                 f"requests, seed {doc['seed']}")
    table = Table(title=escape(title))
    table.add_column("ms", no_wrap=True)
    for name in ("p50", "p90", "p99", "mean"):
        table.add_column(name, justify="right", no_wrap=True)
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "end-to-end")):
        row = doc[key]
        digits = 2 if key == "tpot_ms" else 1
        table.add_row(label, *(f"{row[k]:.{digits}f}" for k in ("p50", "p90", "p99", "mean")))
    console.print(table)
    stats = doc["stats"]
    console.print(f"tokens/s per GPU {doc['tokens_per_s_per_gpu']:.1f}, per user {doc['tokens_per_s_per_user']:.1f}; "
                  f"{stats['engine_steps']:,} engine steps, {stats['preemptions']:,} preemptions, at most "
                  f"{stats['max_running']} running per rank", style="dim")
    c = doc["constants"]
    console.print(f"simulation constants: s_pre {c['s_pre']}, s_dec {c['s_dec']}, tau0 "
                  f"{c['tau0_ms']} ms, output spread {c['osl_spread']}; {escape(c['source'])}", style="dim")
    for note in doc["notes"]:
        console.print(f"note: {escape(note)}", style="dim")


def _batch_size_or_file(value: str | None) -> tuple[int | None, str | None]:
    """``--batch N`` is the batch size; ``--batch FILE`` or ``--batch -`` reads JSON lines."""
    if value is None:
        return None, None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return int(text), None
    return None, value


@app.command("predict")
@handles_errors
def predict_command(
    model: Annotated[str | None, _opt("--model", "HF model id (ORG/NAME, or ORG/NAME@DTYPE served variant).")] = None,
    system: Annotated[str | None, _opt("--system", "System, e.g. h200_sxm.")] = None,
    backend: Annotated[str | None, _opt("--backend", "sglang, vllm or trtllm.")] = None,
    version: Annotated[str | None, _opt("--version", "Backend version (default: the newest the corpus holds, "
                                                     "per table).")] = None,
    mode: Annotated[str, typer.Option("--mode", help="agg or disagg.")] = "agg",
    isl: Annotated[int | None, _opt("--isl", "Input tokens per request.")] = None,
    osl: Annotated[int | None, _opt("--osl", "Output tokens per request.")] = None,
    batch: Annotated[str | None, _opt(
        "--batch", "Concurrent requests per attention-DP rank (agg); or a JSON-lines FILE (- for stdin) of "
                   "silicon_sample.csv rows, answered one JSON line each.")] = None,
    tp: Annotated[str | None, _opt("--tp", "Tensor-parallel ranks per worker (agg); a comma-separated list "
                                         "(1,2,4,8) predicts each.")] = None,
    moe_tp: Annotated[int | None, _opt("--moe-tp", "MoE tensor-parallel ranks (default: GPUs / moe-ep).")] = None,
    moe_ep: Annotated[int | None, _opt("--moe-ep", "MoE expert-parallel ranks (default 1).")] = None,
    attention_dp: Annotated[int | None, _opt("--attention-dp", "Attention data-parallel ranks (default 1).")] = None,
    pp: Annotated[int | None, _opt("--pp", "Pipeline stages (default 1).")] = None,
    gemm_quant: Annotated[str | None, _opt("--gemm-quant", "GEMM dtype served (default: the checkpoint's).")] = None,
    moe_quant: Annotated[str | None, _opt("--moe-quant", "MoE dtype served (default: the checkpoint's).")] = None,
    kv_cache_dtype: Annotated[str | None, _opt(
        "--kv-cache-dtype", "KV cache dtype served, e.g. fp8 (default: the backend's rule, docs/serving.md).")] = None,
    token_budget: Annotated[int | None, _opt(
        "--token-budget", "Tokens one engine step takes at most (vLLM --max-num-batched-tokens; default: the "
                          "backend's, docs/serving.md).")] = None,
    prefill_batch: Annotated[int | None, _opt("--prefill-batch", "disagg: requests per prefill step.")] = None,
    prefill_workers: Annotated[int | None, _opt("--prefill-workers", "disagg: prefill workers.")] = None,
    prefill_tp: Annotated[int | None, _opt("--prefill-tp", "disagg: prefill tp.")] = None,
    prefill_moe_tp: Annotated[int | None, _opt("--prefill-moe-tp", "disagg: prefill MoE tp.")] = None,
    prefill_moe_ep: Annotated[int | None, _opt("--prefill-moe-ep", "disagg: prefill MoE ep.")] = None,
    prefill_attention_dp: Annotated[int | None, _opt("--prefill-attention-dp", "disagg: prefill DP.")] = None,
    decode_batch: Annotated[int | None, _opt("--decode-batch", "disagg: requests per decode rank.")] = None,
    decode_workers: Annotated[int | None, _opt("--decode-workers", "disagg: decode workers.")] = None,
    decode_tp: Annotated[int | None, _opt("--decode-tp", "disagg: decode tp.")] = None,
    decode_moe_tp: Annotated[int | None, _opt("--decode-moe-tp", "disagg: decode MoE tp.")] = None,
    decode_moe_ep: Annotated[int | None, _opt("--decode-moe-ep", "disagg: decode MoE ep.")] = None,
    decode_attention_dp: Annotated[int | None, _opt("--decode-attention-dp", "disagg: decode DP.")] = None,
    physics_only: Annotated[bool, typer.Option(
        "--physics-only", help="Use the op tables' step times as they are (no fitted constants).")] = False,
    allow_substitute: Annotated[bool, typer.Option(
        "--allow-substitute", help="Price attention a table measured for another native head count from the "
                                   "nearest native, per head (the answer lists each substitution).")] = False,
    percentiles: Annotated[bool, typer.Option(
        "--percentiles", help="Also p50 / p90 / p99 of TTFT, TPOT and end-to-end latency from a request-level "
                              "simulation of the backend's scheduler (aggregated deployments).")] = False,
    request_rate: Annotated[float | None, _opt(
        "--request-rate", "With --percentiles: simulate an open loop of Poisson arrivals at this many requests/s "
                          "over the deployment (default: a closed loop at the concurrency).")] = None,
    seed: Annotated[int | None, _opt("--seed", "With --percentiles: the seed of the open loop's arrivals and of the "
                                               "output lengths (default 0).")] = None,
    data_root: DataRootOpt = None,
    model_configs: ModelConfigsOpt = None,
    json_out: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Predict TTFT and TPOT of one deployment (docs/serving.md), or of JSON lines of them.

    Exit codes: 0 answered (every line, with a batch file), 1 not covered (or any batch line
    failed), 2 usage errors.
    """
    batch_size, batch_file = _batch_size_or_file(batch)
    simulation = _simulation_options(percentiles, request_rate, seed)
    db = Database(str(data_root) if data_root else None, [str(p) for p in model_configs or []])
    if batch_file is not None:
        raise typer.Exit(_run_batch(db, batch_file, fitted=not physics_only, allow_substitute=allow_substitute,
                                    simulation=simulation))
    row: dict[str, Any] = {
        "model_path": model, "system": system, "backend": backend, "backend_version": version, "mode": mode,
        "isl": isl, "osl": osl, "gemm_quant_mode": gemm_quant, "moe_quant_mode": moe_quant,
        "kv_cache_dtype": kv_cache_dtype, "token_budget": token_budget,
        "batch_size": batch_size, "tp_size": tp, "pp_size": pp, "attention_dp_size": attention_dp,
        "moe_tp_size": moe_tp, "moe_ep_size": moe_ep,
        "prefill_batch_size": prefill_batch, "prefill_num_workers": prefill_workers, "prefill_tp_size": prefill_tp,
        "prefill_moe_tp_size": prefill_moe_tp, "prefill_moe_ep_size": prefill_moe_ep,
        "prefill_attention_dp_size": prefill_attention_dp, "decode_batch_size": decode_batch,
        "decode_num_workers": decode_workers, "decode_tp_size": decode_tp, "decode_moe_tp_size": decode_moe_tp,
        "decode_moe_ep_size": decode_moe_ep, "decode_attention_dp_size": decode_attention_dp}
    missing = [f"--{n}" for n, v in (("model", model), ("system", system), ("backend", backend), ("isl", isl),
                                     ("osl", osl)) if v is None]
    if missing:
        raise E.UsageError(f"missing {', '.join(missing)}", values={"missing": missing},
                           fix="modperf predict --model M --system S --backend B --isl N --osl N --batch N --tp N")
    if version is not None and system is not None and backend is not None:
        check_version(db, system, backend, version)  # a version the flag names: one the corpus holds
    tps = parse_tps(tp) if tp is not None else [None]
    if len(tps) > 1 and mode != "agg":
        raise E.UsageError("--tp takes a list with --mode agg (disagg: --prefill-tp and --decode-tp)",
                           values={"tp": tp, "mode": mode}, fix="give one --tp, or --mode agg")
    results: list[Prediction | E.ModperfError] = []
    simulated: list[dict[str, Any] | None] = []
    for one in tps:
        dep = deployment_from_row({k: v for k, v in {**row, "tp_size": one}.items() if v is not None})
        try:
            result, sim = _answer(db, dep, fitted=not physics_only, allow_substitute=allow_substitute,
                                  simulation=simulation)
        except E.ModperfError as exc:  # one tp out of coverage: the others are still answered
            if len(tps) == 1:  # one tp: its error is the command's (exit 2 for a bad value, 1 not covered)
                raise
            results.append(exc)
            simulated.append(None)
            continue
        results.append(result)
        simulated.append(sim)
    if len(results) == 1:
        assert isinstance(results[0], Prediction)
        if json_out:
            emit_json(_with_percentiles(results[0].to_dict(), simulated[0]))
        else:
            print_prediction(results[0])
            if simulated[0] is not None:
                print_percentiles(simulated[0])
        return
    if json_out:
        emit_json({"tps": tps, "predictions": [_with_percentiles(r.to_dict(), sim) if isinstance(r, Prediction)
                                               else {"tp": t, **error_line(r)}
                                               for t, r, sim in zip(tps, results, simulated)]})
    else:
        print_predictions(tps, results)
        for t, sim in zip(tps, simulated):
            if sim is not None:
                print_percentiles(sim, tp=t)
    raise typer.Exit(1 if any(isinstance(r, E.ModperfError) for r in results) else 0)


def _with_percentiles(doc: dict[str, Any], simulated: dict[str, Any] | None) -> dict[str, Any]:
    return doc | {"percentiles": simulated} if simulated is not None else doc


def _simulation_options(percentiles: bool, request_rate: float | None, seed: int | None) -> dict[str, Any] | None:
    """The simulation's options, or None without --percentiles; the flags that only shape
    the simulation are refused without it (and a seed where nothing is random:
    modperf.serving.percentiles.percentiles)."""
    if not percentiles:
        given = [name for name, value in (("--request-rate", request_rate), ("--seed", seed)) if value is not None]
        if given:
            raise E.UsageError(f"{', '.join(given)} shape(s) the simulation: give --percentiles too",
                               values={"given": given}, fix="add --percentiles, or drop " + ", ".join(given))
        return None
    if request_rate is not None and not (math.isfinite(request_rate) and request_rate > 0):
        raise E.UsageError("--request-rate must be a positive number of requests per second",
                           values={"request_rate": request_rate}, fix="e.g. --request-rate 4")
    return {"request_rate": request_rate, "seed": seed}


def _answer(db: Database, dep: Deployment, *, fitted: bool, allow_substitute: bool,
            simulation: dict[str, Any] | None) -> tuple[Prediction, dict[str, Any] | None]:
    """The closed form's prediction (modperf.serving.predict.predict), and the simulation's
    percentiles when asked, on the same priced steps."""
    priced = price(db, dep, allow_substitute=allow_substitute)
    result = solve(priced, *constants_for(dep, fitted))
    if simulation is None:
        return result, None
    return result, simulate_percentiles(db, dep, fitted=fitted, priced=priced, **simulation)


def _run_batch(db: Database, path: str, *, fitted: bool, allow_substitute: bool,
               simulation: dict[str, Any] | None = None) -> int:
    def predict_lines(rows: list[dict[str, Any]]) -> list[tuple[bool, str]]:
        out: list[tuple[bool, str]] = []
        for row in rows:
            try:
                result, simulated = _answer(db, deployment_from_row(row), fitted=fitted,
                                            allow_substitute=allow_substitute, simulation=simulation)
                out.append((True, dumps(_with_percentiles(result.to_dict(), simulated))))
            except Exception as exc:  # a bad line never stops the batch
                row_id = row.get("id")
                out.append((False, dumps({"id": row_id if isinstance(row_id, str) else None, **error_line(exc)})))
        return out

    stream = open_batch(path)
    # one line at a time (a prediction takes milliseconds: each is written as it is priced)
    lines = run_chunks(read_lines(stream), predict_lines, chunk=1, fix=_LINE_FIX, error_fields={"id": None})
    return 1 if write_answers(path, stream, lines) else 0
