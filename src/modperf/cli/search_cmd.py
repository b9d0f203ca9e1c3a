"""``modperf search``: which deployment to run (docs/search.md)."""

from __future__ import annotations

import re
import shlex
import sys
import textwrap
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ..query.db import Database
from ..search import REASONS, Point, SearchResult, search
from ._app import app
from ._common import DataRootOpt, JsonOpt, ModelConfigsOpt, console, emit_json, err_console, handles_errors

#: Human output is written for 80 columns.
WIDTH = 80
#: Column heads of the reasons a deployment is left out (docs/search.md).
HEADS = {"no_table": "no table", "over_limit": "over limit", "concurrency": "split"}


def _opt(name: str, help_text: str) -> Any:
    return typer.Option(name, help=help_text, show_default=False)


def _say(text: str, style: str | None = None, indent: str = "") -> None:
    for line in textwrap.wrap(text, WIDTH - 1, initial_indent=indent, subsequent_indent=indent + "  ") or [""]:
        console.print(escape(line), style=style, soft_wrap=True)


def describe(p: Point) -> str:
    """A deployment in a few words: ``tp4 b64 x2`` (agg: parallelism, batch per rank,
    replicas); ``P2:tp2 b1 D1:tp4 b64`` (disagg: each pool's workers, parallelism, batch)."""
    d = p.deployment

    def pool(x: Any) -> str:
        text = f"tp{x.tp}"
        if x.attention_dp > 1:
            text += f" dp{x.attention_dp}"
        if x.moe_tp is not None and x.moe_ep > 1:
            text += f" ep{x.moe_ep}"
        return f"{text} b{x.batch}"

    if d.mode == "agg":
        return pool(d.pool) + (f" x{p.replicas}" if p.replicas > 1 else "")
    assert d.prefill is not None and d.decode is not None
    return f"P{d.prefill.workers}:{pool(d.prefill)} D{d.decode.workers}:{pool(d.decode)}"


def _points_table(title: str, points: list[Point], many_backends: bool) -> Table:
    table = Table(title=escape(title), title_justify="left", pad_edge=False, box=None, padding=(0, 1))
    table.add_column("tok/s/user", justify="right", no_wrap=True)
    table.add_column("tok/s/GPU", justify="right", no_wrap=True)
    table.add_column("TTFT ms", justify="right", no_wrap=True)
    table.add_column("TPOT ms", justify="right", no_wrap=True)
    table.add_column("users", justify="right", no_wrap=True)
    table.add_column("GPUs", justify="right", no_wrap=True)
    if many_backends:
        table.add_column("backend", no_wrap=True)
    table.add_column("deployment", overflow="fold")
    for p in points:
        row = [f"{p.tokens_per_s_per_user:.1f}", f"{p.tokens_per_s_per_gpu:.1f}", f"{p.ttft_ms:.0f}",
               f"{p.tpot_ms:.2f}", str(p.concurrency), str(p.gpus)]
        if many_backends:
            row.append(p.backend)
        table.add_row(*row, escape(describe(p)))
    return table


def print_result(r: SearchResult, launch: bool) -> None:
    limits = []
    if r.limits.ttft_ms is not None:
        limits.append(f"TTFT <= {r.limits.ttft_ms:g} ms")
    if r.limits.tpot_ms is not None:
        limits.append(f"TPOT <= {r.limits.tpot_ms:.4g} ms ({1000 / r.limits.tpot_ms:.4g} tokens/s/user)")
    load = (f"; {r.concurrency} users" if r.concurrency else "") + \
        (f"; {r.request_rate:g} requests/s" if r.request_rate else "")
    _say(f"{r.model} on {r.gpus} x {r.system}, isl {r.isl}, osl {r.osl}{load}; "
         f"{', '.join(r.backends)}" + (f" {r.version}" if r.version else ""), style="bold")
    _say("limits: " + (", ".join(limits) if limits else "none"))
    _say("deployment: tp, dp, ep per worker, b requests per rank, xR replicas; P/D: prefill and decode "
         "workers (docs/search.md)", style="dim")
    many = len(r.backends) > 1
    for m in r.modes:
        console.print()
        console.print(_points_table(f"{m} front: tokens/s/GPU vs tokens/s/user ({len(r.fronts[m])} points)",
                                    r.fronts[m], many), width=WIDTH)
    console.print()
    _say("best under the limits, per mode and backend", style="bold")
    if not r.best:
        _say("none: no deployment is in the space under the limits (left out, below)")
    for p in r.best:
        _say(f"{p.mode} {p.backend}: {describe(p)}", style="bold", indent="  ")
        _say(f"TTFT {p.ttft_ms:.1f} ms, TPOT {p.tpot_ms:.2f} ms, {p.tokens_per_s_per_gpu:.1f} tokens/s/GPU, "
             f"{p.tokens_per_s_per_user:.1f} tokens/s/user, {p.concurrency} users on {p.gpus} GPUs", indent="    ")
        if p.prediction is not None:
            from ..search.engine import priced_how

            how = priced_how(p.prediction)
            _say("ops: " + ", ".join(f"{n} {k}" for k, n in how["kinds"].items()), style="dim", indent="    ")
            if how["substitutions"]:
                _say("tables of another version: " + ", ".join(how["substitutions"]), style="dim", indent="    ")
            for note in how["notes"]:
                _say(f"note: {note}", style="dim", indent="    ")
    if len(r.modes) > 1 or any(len(v) > 1 for v in r.top.values()):
        for m in r.modes:
            if r.top[m]:
                console.print()
                console.print(_points_table(f"top {len(r.top[m])} {m}, by tokens/s/GPU", r.top[m], many),
                              width=WIDTH)
    console.print()
    counts = Table(title="deployments searched", title_justify="left", box=None, pad_edge=False, padding=(0, 1))
    for name in ("mode", "found", "priced", "kept", *[HEADS.get(r, r) for r in REASONS]):
        counts.add_column(name, justify="right" if name != "mode" else "left", no_wrap=True)
    for m in r.modes:
        c = r.total(m)
        counts.add_row(m, f"{c.enumerated:,}", f"{c.evaluated:,}", f"{c.kept:,}",
                       *(f"{c.left_out.get(x, 0):,}" for x in REASONS))
    console.print(counts, width=WIDTH)
    _say("left out, first reasons:", style="dim")
    for m in r.modes:
        for reason, examples in r.total(m).examples.items():
            for why in examples[:1]:
                _say(f"{m} {HEADS.get(reason, reason)}: {why}", style="dim", indent="  ")
    for note in r.notes:
        _say(f"note: {note}", style="dim")
    _say(f"{sum(r.total(m).enumerated for m in r.modes):,} deployments in {r.seconds:.2f} s", style="dim")
    if launch:
        print_launch(r)


def print_launch(r: SearchResult) -> None:
    shown: set[int] = set()
    for m in r.modes:
        for rank, p in enumerate(r.top[m], 1):
            if id(p) in shown or not p.launch:
                continue
            shown.add(id(p))
            console.print()
            _say(f"# launch {m} #{rank} ({p.backend}): {describe(p)}", style="bold")
            files: dict[str, str] = {}
            for proc in p.launch:
                for name, text in proc["files"].items():
                    if files.get(name) != text:
                        files[name] = text
                        console.print(escape(f"cat > {name} <<'EOF'\n{text}EOF"), soft_wrap=True)
                for note in proc["notes"]:
                    _say(f"# {note}", style="dim")
                prefix = f"# {proc['role']}" + (f", node {proc['node']}" if proc["node"] else "")
                console.print(escape(prefix), style="dim")
                console.print(escape(wrap_command(proc["command"])), soft_wrap=True)


def wrap_command(command: str, width: int = WIDTH - 2) -> str:
    """A shell command over lines of at most ``width`` characters, continued with backslashes
    (an argument longer than the line stays whole)."""
    lines: list[str] = []
    line = ""
    words = shlex.split(command)
    env = 0
    while env < len(words) and re.match(r"[A-Z_][A-Z0-9_]*=", words[env]):
        env += 1
    quoted = [w.split("=", 1)[0] + "=" + shlex.quote(w.split("=", 1)[1]) for w in words[:env]]
    for word in quoted + [shlex.quote(w) for w in words[env:]]:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line + " \\")
            line = "    " + word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return "\n".join(lines)


class _Progress:
    """Progress on stderr once the search has run a second: a transient bar on a terminal,
    a line every two seconds otherwise."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.last = 0.0
        self.bar: Any = None
        self.task: Any = None
        self.said = False

    def __call__(self, done: int, total: int, item: Any = None) -> None:
        now = time.perf_counter() - self.start
        if now < 1.0:
            return
        if err_console.is_terminal:
            if self.bar is None:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

                self.bar = Progress(TextColumn("searching"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                    console=err_console, transient=True)
                self.bar.start()
                self.task = self.bar.add_task("", total=total)
            self.bar.update(self.task, completed=done, total=total)
            return
        if now - self.last >= 2.0 or not self.said:
            self.last, self.said = now, True
            sys.stderr.write(f"searching: {done}/{total} parallel layouts, {now:.1f} s\n")
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        elif self.said:
            sys.stderr.write(f"searching: done in {time.perf_counter() - self.start:.1f} s\n")


@app.command("search")
@handles_errors
def search_command(
    model: Annotated[str | None, _opt("--model", "HF model id (ORG/NAME).")] = None,
    system: Annotated[str | None, _opt("--system", "System, e.g. h200_sxm.")] = None,
    gpus: Annotated[int | None, _opt("--gpus", "GPUs to deploy on (N).")] = None,
    isl: Annotated[int | None, _opt("--isl", "Input tokens per request.")] = None,
    osl: Annotated[int | None, _opt("--osl", "Output tokens per request.")] = None,
    backend: Annotated[str, typer.Option("--backend", help="vllm, sglang, trtllm or all.")] = "all",
    version: Annotated[str | None, _opt("--version", "Backend version of the tables (one backend).")] = None,
    mode: Annotated[str, typer.Option("--mode", help="agg, disagg or both.")] = "both",
    ttft_ms: Annotated[float | None, _opt("--ttft-ms", "Limit: TTFT at most X ms.")] = None,
    tpot_ms: Annotated[float | None, _opt("--tpot-ms", "Limit: TPOT at most Y ms.")] = None,
    tokens_per_user: Annotated[float | None, _opt(
        "--tokens-per-user", "Limit: at least T tokens/s per user (TPOT <= 1000/T).")] = None,
    concurrency: Annotated[int | None, _opt("--concurrency", "Closed-loop users over the deployment.")] = None,
    request_rate: Annotated[float | None, _opt(
        "--request-rate", "Requests per second the deployment must carry.")] = None,
    gemm_type: Annotated[str | None, _opt("--gemm-type", "GEMM dtype served (default: the checkpoint's).")] = None,
    moe_dtype: Annotated[str | None, _opt("--moe-dtype", "MoE dtype served (default: the checkpoint's).")] = None,
    kv_cache_dtype: Annotated[str | None, _opt(
        "--kv-cache-dtype", "KV cache dtype (default: the backend's rule).")] = None,
    top: Annotated[int, typer.Option("--top", help="Deployments listed per mode.")] = 5,
    plot: Annotated[Path | None, _opt("--plot", "Draw the fronts to FILE (.png or .svg; needs matplotlib).")] = None,
    launch: Annotated[bool, typer.Option("--launch", help="Print the commands that start the top deployments.")]
    = False,
    out: Annotated[Path | None, _opt("--out", "Write the fronts and the top K as CSV and JSON to DIR.")] = None,
    data_root: DataRootOpt = None,
    model_configs: ModelConfigsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Which deployment to run: the agg and disagg fronts, the best under the limits, the
    launch commands (docs/search.md).

    Exit codes: 0 a deployment found, 1 none in the space under the limits, 2 usage errors.
    """
    from ..base import errors as E

    missing = [f"--{n}" for n, v in (("model", model), ("system", system), ("gpus", gpus), ("isl", isl),
                                     ("osl", osl)) if v is None]
    if missing:
        raise E.UsageError(f"missing {', '.join(missing)}", values={"missing": missing},
                           fix="modperf search --model M --system S --gpus N --isl I --osl O")
    if plot is not None and plot.suffix.lower() not in (".png", ".svg"):
        raise E.OptionValueError("--plot writes .png or .svg files", values={"plot": str(plot)},
                                 fix="name the file e.g. fronts.png")
    if plot is not None:
        from ..audit.plot import pyplot

        pyplot()  # matplotlib missing: the typed error now, before the search
    assert model is not None and system is not None and gpus is not None and isl is not None and osl is not None
    db = Database(str(data_root) if data_root else None, [str(p) for p in model_configs or []])
    bar = _Progress()
    try:
        result = search(db, model=model, system=system, gpus=gpus, isl=isl, osl=osl, backend=backend, version=version,
                        mode=mode, ttft_ms=ttft_ms, tpot_ms=tpot_ms, tokens_per_user=tokens_per_user,
                        concurrency=concurrency, request_rate=request_rate, gemm_type=gemm_type, moe_dtype=moe_dtype,
                        kv_cache_dtype=kv_cache_dtype, top=top, launch=launch, progress=bar)
    finally:
        bar.close()
    written: list[Path] = []
    if out is not None:
        from ..search.files import write_outputs

        written = write_outputs(result, out)
    if plot is not None:
        from ..audit.plot import plot_fronts

        written.append(plot_fronts(result, plot))
    if json_out:
        doc = result.to_dict()
        doc["written"] = [str(p) for p in written]
        emit_json(doc)
    else:
        print_result(result, launch)
        for path in written:  # (a path longer than the line stays whole)
            console.print(escape(f"wrote {path}"), style="dim", soft_wrap=True)
    if not any(result.top.values()):
        raise typer.Exit(1)
