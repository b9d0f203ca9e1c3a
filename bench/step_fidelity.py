"""Step fidelity: where the serving predictions' error sits, on both halves of the silicon rows.

The error of TTFT and TPOT (signed median and |relative error| median / p90), on calibration
and evaluation rows side by side, by

* concurrency band (the closed loop's users: <= 4 isolates the step, higher bands the
  scheduler),
* backend x mode, GPU generation (``modperf.serving.generation_of``), model family,

each with the physics-only step (the op tables' steps as priced, no fitted constant) beside the
fitted constants the backends carry. ``--levers`` then switches each rule of the step and the
serving model off in turn (or, for a rule dropped after its ablation, puts it back), re-prices
what it changes, refits the constants on the calibration half (as ``bench/silicon.py --fit``
would) and prints the headline of both halves: the effect of each lever on calibration and
evaluation alike. Rules found by reading evaluation rows (the pricing fallbacks, TRT-LLM's fp8
KV, the memory floor) are among the levers (docs/serving.md, "Rules found on evaluation
rows"). ``--floors`` prints the GEMM tables' per-call floors that a CUDA graph removes.

    python bench/step_fidelity.py                 # the bands and groups, fitted and physics-only
    python bench/step_fidelity.py --levers        # also every lever's ablation (re-prices: minutes)

Prints tables; asserts nothing. Reads nothing of the evaluation rows but their score.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import sys
import time
from typing import Any

from silicon import calibration_rows, fit, predictions, price_all
from silicon_tool import stats

import modperf
from modperf.serving import generation_of
from modperf.serving.predict import FALLBACKS, Priced
from modperf.serving.silicon import silicon_rows

BANDS = ((1, 4, "<= 4"), (5, 32, "5-32"), (33, 256, "33-256"), (257, 1 << 30, "> 256"))
FAMILIES = (("deepseek", "DeepSeek"), ("kimi", "Kimi"), ("glm", "GLM"), ("qwen3.5", "Qwen3.5"),
            ("qwen3-235b", "Qwen3 MoE"), ("qwen3-32b", "Qwen3 dense"), ("llama", "Llama"),
            ("minimax", "MiniMax"), ("gpt-oss", "gpt-oss"))


def family(model: str) -> str:
    low = model.lower()
    return next((name for key, name in FAMILIES if key in low), model)


def band(concurrency: int | None) -> str:
    if concurrency is None:
        return "unknown"
    return next(name for lo, hi, name in BANDS if lo <= concurrency <= hi)


def concurrency_of(r: dict[str, Any], priced: dict[str, Any]) -> int | None:
    p = priced[r["id"]]
    return p.concurrency if isinstance(p, Priced) else None


def _fmt(values: tuple[float, float, float]) -> str:
    med, p90, signed = values
    if med != med:
        return f"{'':>20}"
    return f"{signed:>+6.2f} {med:>5.2f}/{p90:>5.2f}"


def table(title: str, rows: list[dict[str, Any]], priced, fitted, physics, key) -> None:
    """One line per group and split: rows, answered; TPOT and TTFT, physics step and fitted."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows:
        groups[(str(key(r)), r["split"])].append(r)
    print(f"\n{title}")
    print(f"{'group':<34} {'half':<5} {'rows':>5} {'ans':>5}   {'TPOT physics':>20} {'TPOT fitted':>20}   "
          f"{'TTFT physics':>20} {'TTFT fitted':>20}")
    print(f"{'':<34} {'':<5} {'':>5} {'':>5}   {'signed med / p90':>20} {'signed med / p90':>20}   "
          f"{'signed med / p90':>20} {'signed med / p90':>20}")
    for (name, half) in sorted(groups, key=lambda k: (k[0], k[1] != "calib")):
        g = groups[(name, half)]
        got = [r for r in g if r["id"] in fitted]
        line = f"{name:<34} {half:<5} {len(g):>5} {len(got) / len(g):>5.0%}"
        if got:
            cells = []
            for metric, i in (("tpot", 1), ("ttft", 0)):
                for preds in (physics, fitted):
                    cells.append(_fmt(stats([(preds[r["id"]][i], r[f"silicon_{metric}_ms"]) for r in got])))
            line += f"   {cells[0]} {cells[1]}   {cells[2]} {cells[3]}"
        print(line)


def strict_only(priced: dict[str, Any]) -> dict[str, Any]:
    """The priced rows with those answered only with a substitution or on an assumed topology
    made unanswered (bench/silicon.py scores both apart)."""
    return {k: (RuntimeError("substituted") if isinstance(v, Priced) and v.substitutions
                else RuntimeError("assumed") if isinstance(v, Priced) and v.assumptions else v)
            for k, v in priced.items()}


def headline(rows, priced, preds) -> str:
    out = []
    for half in ("calib", "eval"):
        g = [r for r in rows if r["split"] == half]
        got = [r for r in g if r["id"] in preds]
        t = stats([(preds[r["id"]][0], r["silicon_ttft_ms"]) for r in got])
        p = stats([(preds[r["id"]][1], r["silicon_tpot_ms"]) for r in got])
        out.append(f"{half} {len(got) / len(g):>4.0%} TTFT {t[0]:.3f}/{t[1]:.3f} ({t[2]:+.2f}) "
                   f"TPOT {p[0]:.3f}/{p[1]:.3f} ({p[2]:+.2f})")
    return "   ".join(out)


def dedupe(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per measurement and half (a re-export under several ids counted once)."""
    seen, out = set(), []
    for r in rows:
        key = (r["silicon_ttft_ms"], r["silicon_tpot_ms"], r["split"])
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def price(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return price_all(modperf.open(), rows)


def without_fallbacks(priced: dict[str, Any], which: str) -> dict[str, Any]:
    """The priced rows with those standing on the fallback ``which`` made unanswered."""
    name = FALLBACKS[which]
    return {k: (v if not (isinstance(v, Priced) and name in v.fallbacks) else RuntimeError(which))
            for k, v in priced.items()}


def with_inputs(priced: dict[str, Any], change) -> dict[str, Any]:
    """A copy of the priced rows with ``change(priced_row)`` -> new inputs (or an exception:
    the row is then not answered) applied to each strictly priced row."""
    out = {}
    for k, v in priced.items():
        if not isinstance(v, Priced) or v.substitutions:
            out[k] = v
            continue
        try:
            new = change(v)
        except Exception as exc:
            out[k] = exc
            continue
        out[k] = dataclasses.replace(v, inputs=new) if new is not v.inputs else v
    return out


@contextlib.contextmanager
def switched(rule: str):
    """A rule found on evaluation rows switched for its ablation's figures (docs/serving.md,
    "Rules found on evaluation rows"): ``memory_floor`` (dropped) put back as it stood --
    where the backend's default rule leaves less than one request of KV but the GPU holds one,
    the physical remainder is the budget; ``fp8_kv`` (kept) taken away -- TRT-LLM's 8- or 4-bit
    checkpoints get the model's bfloat16 KV cache instead of fp8."""
    import modperf.serving.predict as predict_module
    from modperf.serving import TRTLLM, memory

    original_pool, original_element = predict_module.pool_memory, TRTLLM.kv_element_bytes

    def with_floor(backend, config, pool, *, system, memory: Any, chunk, tokens, reserved, element, what=""):
        try:
            return original_pool(backend, config, pool, system=system, memory=memory, chunk=chunk, tokens=tokens,
                                 reserved=reserved, element=element, what=what)
        except modperf.base.errors.DeploymentFitError as exc:
            if "default memory rule" not in exc.detail:
                raise
        weights = memory_module.weight_bytes_per_gpu(config, pool)
        per_token = memory_module.kv_bytes_per_token(config, pool.tp, tokens, element)
        physical = memory.capacity - weights - memory.other
        fits = int(physical // (per_token * reserved)) if per_token > 0 else backend.max_running
        return memory_module.PoolMemory(weights, physical, per_token, reserved, min(fits, backend.max_running),
                                        ["memory floor (put back)"])

    memory_module = memory
    if rule == "memory_floor":
        predict_module.pool_memory = with_floor
    else:
        TRTLLM.kv_element_bytes = lambda self, dtype: 2.0
    try:
        yield
    finally:
        predict_module.pool_memory, TRTLLM.kv_element_bytes = original_pool, original_element


def reprice_under(db: modperf.Database, rows: list[dict[str, Any]], strict: dict[str, Any], rule: str
                  ) -> tuple[dict[str, Any], dict[str, int]]:
    """The rows a switched rule may change re-priced under it (the memory floor: rows the
    default rule refuses; fp8 KV: TRT-LLM rows of 8- or 4-bit GEMMs)."""
    from modperf.serving.predict import deployment_from_row, price
    from modperf.serving.silicon import question

    out, changed = dict(strict), {"calib": 0, "eval": 0}
    with switched(rule):
        for r in rows:
            v = strict[r["id"]]
            refused = isinstance(v, modperf.base.errors.DeploymentFitError)
            quantised = r["backend"] == "trtllm" and str(r.get("gemm_quant_mode") or "") not in ("", "bf16", "fp16")
            if not (refused or (rule == "fp8_kv" and quantised and isinstance(v, Priced))):
                continue
            try:
                out[r["id"]] = price(db, deployment_from_row(question(r)))
            except modperf.base.errors.ModperfError as exc:
                out[r["id"]] = exc
            if isinstance(out[r["id"]], Priced) != isinstance(v, Priced) or (
                    isinstance(v, Priced) and out[r["id"]].inputs != v.inputs):
                changed[r["split"]] += 1
    return out, changed


def decode_eager(db: modperf.Database):
    """The change of :func:`with_inputs` for decode steps priced eagerly (as the op tables
    measured them), not as a CUDA graph replays them: the decode step re-priced alone."""
    from modperf.model.step import DecodePart, step_cost
    from modperf.serving.predict import _version_for, ffn_has_moe, served_model
    from modperf.specs.roofline import gpu_spec

    def change(p: Priced):
        dep = p.deployment
        config = served_model(db, dep)
        pool = dep.pool if dep.mode == "agg" else dep.decode
        step = p.steps["decode"]
        hop = (pool.pp - 1) * gpu_spec(dep.system).p2p_latency * 1000.0
        cost = step_cost(db, model=config.model_id, system=dep.system, backend=dep.backend,
                         parallel=pool.parallel(ffn_has_moe(config)), version=_version_for(db, dep, []),
                         decode=DecodePart(step["batch"], step["kv"]))
        if cost.total_ms is None:
            raise RuntimeError("partial")
        return dataclasses.replace(p.inputs, decode_ms=float(cost.total_ms) + hop)
    return change


def _differs(a: Any, b: Any) -> bool:
    """Whether a row is priced differently (answered on one side only, or other steps)."""
    if isinstance(a, Priced) != isinstance(b, Priced):
        return True
    return isinstance(a, Priced) and a.steps != b.steps


def levers(rows: list[dict[str, Any]], priced: dict[str, Any]) -> None:
    """Every lever off in turn, the constants refitted on the calibration half, the headline of
    both halves (strict rows)."""
    print("\nLEVERS (each off in turn; constants refitted on calibration rows; strict rows)")
    strict = strict_only(priced)

    def line(label: str, these: dict[str, Any], **form: Any) -> None:
        print(f"  {label:<58} {headline(rows, these, predictions(rows, these, fit(rows, these, **form)))}")

    line("everything on (as shipped)", strict)
    print(f"  {'physics-only constants':<58} {headline(rows, strict, predictions(rows, strict, 'physics'))}")
    line("step scales pooled over generations", strict, generation="all")
    line("no host floor (host_op_ms 0)", strict, host_floor=False)
    line("disaggregated host floor fitted too", strict, disagg_host_floor=True)
    mixed = with_inputs(strict, lambda p: dataclasses.replace(p.inputs, scheduler="mixed")
                        if hasattr(p.inputs, "scheduler") else p.inputs)
    line("SGLang capped as a mixed step (not prefill first)", mixed)
    for which in FALLBACKS:
        cut = without_fallbacks(strict, which)
        n = {h: sum(1 for r in rows if r["split"] == h and isinstance(strict[r["id"]], Priced)
                    and not isinstance(cut[r["id"]], Priced)) for h in ("calib", "eval")}
        line(f"without fallback {which} (rows lost: {n['calib']} calib, {n['eval']} eval)", cut)
    db = modperf.open()
    for rule in ("memory_floor", "fp8_kv"):
        again, changed = reprice_under(db, rows, strict, rule)
        what = "dropped rule memory_floor put back" if rule == "memory_floor" else f"without {rule}"
        line(f"{what} (rows changed: {changed['calib']} calib, {changed['eval']} eval)", again)
    import modperf.model.pricer as pricer

    for attr, off, what in (("MXFP4_DEFAULT_KERNEL", {}, "without TRT-LLM's default mxfp4 kernel per GPU"),
                            ("MLP_TP_CAPPING_BACKENDS", (), "without TRT-LLM's dense-MLP tp cap")):
        kept = getattr(pricer, attr)
        setattr(pricer, attr, off)
        try:
            again = strict_only(price_all(modperf.open(), rows))
        finally:
            setattr(pricer, attr, kept)
        n = {h: sum(1 for r in rows if r["split"] == h and _differs(strict[r["id"]], again[r["id"]]))
             for h in ("calib", "eval")}
        line(f"{what} (rows changed: {n['calib']} calib, {n['eval']} eval)", again)
    start = time.perf_counter()
    eager = with_inputs(strict, decode_eager(db))
    line(f"decode steps eager, not graphed ({time.perf_counter() - start:.0f} s to re-price)", eager)


def floors(systems: tuple[str, ...] = ("h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm", "gb200", "gb300")) -> None:
    """Per GEMM table (every backend version of the systems the silicon rows use): the per-call
    floor of each bucket at m = 1 and 8 (modperf.model.step.gemm_floors), the GPU's own floor
    (the table's lowest bucket), and what a CUDA graph removes: the difference."""
    from modperf.model.step import GemmFloors, gemm_floors

    db = modperf.open()
    print("\nGEMM PER-CALL FLOORS (us; median of weights <= 4M elements at that m): bucket floor / GPU floor "
          "-> removed in a graphed decode step")
    for ref in sorted(db.catalog.slots, key=lambda r: (r.system, r.backend, str(r.version))):
        if ref.table != "gemm" or ref.system not in systems:
            continue
        f = gemm_floors(db, ref.system, ref.backend, str(ref.version))
        for key, series in sorted(f.buckets.items(), key=str):
            cells = []
            for m in (1, 8):
                fl, gpu = GemmFloors.at(series, m), GemmFloors.at(f.gpu, m)
                if fl is None or gpu is None:
                    continue
                cells.append(f"m {m}: {fl * 1e3:6.1f} / {gpu * 1e3:4.1f} -> {max(fl - gpu, 0) * 1e3:6.1f}")
            name = "/".join(str(k) for k in key if k != "gemm")
            print(f"  {ref.system:<9} {ref.backend:<7} {ref.version!s:<11} {name[:44]:<44} {'   '.join(cells)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levers", action="store_true", help="also switch each lever off (re-prices: minutes)")
    parser.add_argument("--floors", action="store_true", help="also the GEMM tables' per-call floors")
    args = parser.parse_args()
    every = silicon_rows()
    start = time.perf_counter()
    priced = price(every)
    print(f"priced {len(every)} rows in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    rows = dedupe(every)
    strict = strict_only(priced)  # substituted and assumed rows are scored by bench/silicon.py, apart
    fitted = predictions(rows, strict)
    physics = predictions(rows, strict, "physics")
    guessed = {k: v for k, v in priced.items() if isinstance(v, Priced) and v.assumptions and not v.substitutions}
    print(f"rows (one per measurement and half): calibration {sum(r['split'] == 'calib' for r in rows)}, "
          f"evaluation {sum(r['split'] == 'eval' for r in rows)}; calibration rows the fit may use: "
          f"{len(calibration_rows(every, priced))}")
    print("cells: signed median relative error, then |relative error| median / p90")
    table("BY CONCURRENCY BAND (aggregated)", [r for r in rows if r["mode"] == "agg"], priced, fitted, physics,
          lambda r: band(concurrency_of(r, priced)))
    table("BY CONCURRENCY BAND (disaggregated)", [r for r in rows if r["mode"] == "disagg"], priced, fitted,
          physics, lambda r: band(concurrency_of(r, priced)))
    table("BY BACKEND x MODE", rows, priced, fitted, physics, lambda r: f"{r['backend']} {r['mode']}")
    table("BY BACKEND x GENERATION (aggregated)", [r for r in rows if r["mode"] == "agg"], priced, fitted, physics,
          lambda r: f"{r['backend']} {generation_of(r['system'])}")
    table("BY BACKEND x GENERATION x BAND <= 4 (aggregated: the step alone)",
          [r for r in rows if r["mode"] == "agg" and band(concurrency_of(r, priced)) == "<= 4"], priced, fitted,
          physics, lambda r: f"{r['backend']} {generation_of(r['system'])}")
    table("BY MODEL FAMILY", rows, priced, fitted, physics, lambda r: f"{family(r['model_path'])} {r['mode']}")
    assumed_rows = [r for r in rows if r["id"] in guessed]
    table("ASSUMED DECODE BATCH (disaggregated rows without worker counts: concurrency / one decode worker's "
          "ranks), by backend x generation x band", assumed_rows, guessed,
          predictions(assumed_rows, guessed), predictions(assumed_rows, guessed, "physics"),
          lambda r: f"{r['backend']} {generation_of(r['system'])} {band(concurrency_of(r, priced))}")
    if args.floors:
        floors()
    if args.levers:
        levers(every, priced)
    return 0


if __name__ == "__main__":
    sys.exit(main())
