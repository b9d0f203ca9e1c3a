"""``modperf search``, scored and timed (issue 24; docs/search.md).

**Ranking**: does the search pick the deployment that measures best? ``systems/silicon_sample.csv``
rows are grouped by (model, system, backend, isl, osl) on each side of the fixed split
(modperf.serving.silicon.split_of: calibration groups may be used for anything, evaluation groups only
for scoring). For each group with at least three answered rows:

- **Kendall tau** (tau-b) between predicted and measured tokens/s/GPU, where tokens/s/GPU =
  concurrency x osl / (TTFT + (osl - 1) x TPOT) / GPUs of the row's deployment (predicted from
  the predicted TTFT and TPOT, measured from the measured ones);
- **regret of the pick**: the limit is TPOT <= the group's median measured TPOT; the pick is the
  row predicted fastest (tokens/s/GPU) among the rows predicted to meet it; regret = 1 - the
  pick's measured tokens/s/GPU / the best measured among the rows that measurably meet it; a
  pick that measurably misses the limit is a **violation** (its regret is not averaged in);
- **mode**: in groups holding agg and disagg rows, whether the pick's mode is the mode of the
  best measured row under the limit.

Printed per side, backend and group mode (agg, disagg, both), for modperf (the constants each
backend's module carries for its mode and GPU generation, src/modperf/serving/) and, with
``--tool``, for aiconfigurator's own estimate of the same rows (bench/aiconfigurator_serving.py
in child processes, answers cached as ``bench/silicon.py --tool`` caches them): head to head on
the groups both answer three rows of, using the rows both answer.

**Speed** (one run, child processes, interleaved): ``aiconfigurator cli default --model-path
Qwen/Qwen3-32B --total-gpus 8 --system h200_sxm --backend vllm --isl 4000 --osl 500 --ttft 1000
--tpot 30`` (bench/aiconfigurator_search.py, which also counts the points it priced) against
``modperf search`` on the same inputs (both modes), a search of more than 10^5 deployments, and
``bench/silicon.py``'s pricing of all 5,221 rows. Wall and CPU seconds.

    python bench/search.py                    # ranking (modperf) and speed
    python bench/search.py --tool             # ranking beside aiconfigurator (asks rows not cached)
    python bench/search.py --skip-speed       # ranking only (or --skip-ranking)

Prints tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import modperf
from modperf import errors as E
from modperf.serving.predict import deployment_from_row, tokens_per_s_per_gpu
from modperf.serving.silicon import CALIBRATION, EVALUATION, question, silicon_rows

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))  # silicon.py and silicon_tool.py beside this file
TOOL_PYTHON = "/work/scratch/aic-venv/bin/python"
ISSUE = ["--model-path", "Qwen/Qwen3-32B", "--total-gpus", "8", "--system", "h200_sxm", "--backend", "vllm", "--isl",
         "4000", "--osl", "500", "--ttft", "1000", "--tpot", "30"]
SEARCH = ["search", "--model", "Qwen/Qwen3-32B", "--gpus", "8", "--system", "h200_sxm", "--backend", "vllm", "--isl",
          "4000", "--osl", "500", "--ttft-ms", "1000", "--tpot-ms", "30", "--json"]
#: Searches of more than 10^5 deployments: Qwen3-32B over 16 and 32 H200 GPUs on vLLM, and
#: DeepSeek-V3 over 32 GB200 GPUs on TRT-LLM.
LARGE = [*(["search", "--model", "Qwen/Qwen3-32B", "--gpus", n, "--system", "h200_sxm", "--backend", "vllm",
            "--isl", "4000", "--osl", "500", "--ttft-ms", "1000", "--tpot-ms", "30", "--json"] for n in ("16", "32")),
         ["search", "--model", "deepseek-ai/DeepSeek-V3", "--gpus", "32", "--system", "gb200", "--backend", "trtllm",
          "--isl", "4000", "--osl", "500", "--ttft-ms", "2000", "--tpot-ms", "50", "--json"]]


# --- ranking ------------------------------------------------------------------------------------


def shape(row: dict[str, Any]) -> tuple[int, int] | None:
    """(concurrency, GPUs) of a row's deployment, as predict counts them (None: the row does
    not say: a disaggregated row without worker counts)."""
    try:
        dep = deployment_from_row(question(row))
    except E.ModperfError:
        return None
    if dep.mode == "agg":
        assert dep.pool is not None and dep.pool.batch is not None
        return dep.pool.batch * dep.pool.attention_dp, dep.pool.gpus_per_worker
    assert dep.prefill is not None and dep.decode is not None and dep.decode.batch is not None
    pw, dw = dep.prefill.workers, dep.decode.workers
    if pw is None or dw is None:
        return None
    return (dep.decode.batch * dw * dep.decode.attention_dp,
            pw * dep.prefill.gpus_per_worker + dw * dep.decode.gpus_per_worker)


def groups(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """Rows by (split side, model, system, backend, isl, osl)."""
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows:
        out[(r["split"], r["model_path"], r["system"], r["backend"], r["isl"], r["osl"])].append(r)
    return out


def score(rows: list[dict[str, Any]], preds: dict[str, tuple[float, float]]) -> dict[str, Any] | None:
    """Kendall tau, the pick's regret and violation, and the mode check of one group on the
    rows ``preds`` answers (None below three)."""
    from scipy.stats import kendalltau

    got = [r for r in rows if r["id"] in preds and shape(r) is not None]
    if len(got) < 3:
        return None
    osl = int(got[0]["osl"])
    meas, pred, tpot_m, tpot_p = [], [], [], []
    for r in got:
        conc, gpus = shape(r)  # type: ignore[misc]
        t, p = preds[r["id"]]
        pred.append(tokens_per_s_per_gpu(conc, osl, t, p, gpus))
        meas.append(tokens_per_s_per_gpu(conc, osl, r["silicon_ttft_ms"], r["silicon_tpot_ms"], gpus))
        tpot_m.append(r["silicon_tpot_ms"])
        tpot_p.append(p)
    tau = kendalltau(pred, meas).statistic
    limit = float(np.median(tpot_m))
    out: dict[str, Any] = {"n": len(got), "tau": None if math.isnan(tau) else float(tau), "regret": None,
                           "violation": None, "mode_ok": None}
    meeting = [i for i in range(len(got)) if tpot_m[i] <= limit]
    predicted = [i for i in range(len(got)) if tpot_p[i] <= limit]
    if not predicted or not meeting:
        return out
    pick = max(predicted, key=lambda i: pred[i])
    best = max(meeting, key=lambda i: meas[i])
    out["violation"] = tpot_m[pick] > limit
    if not out["violation"]:
        out["regret"] = 1.0 - meas[pick] / meas[best]
    if len({r["mode"] for r in got}) > 1:
        out["mode_ok"] = got[pick]["mode"] == got[best]["mode"]
    return out


def _stats(values: list[float]) -> str:
    if not values:
        return "     -      -"
    return f"{np.median(values):>6.3f} {np.percentile(values, 90):>6.3f}"


def summary(scores: list[dict[str, Any]]) -> str:
    taus = [s["tau"] for s in scores if s["tau"] is not None]
    regrets = [s["regret"] for s in scores if s["regret"] is not None]
    picks = [s for s in scores if s["violation"] is not None]
    mixed = [s["mode_ok"] for s in scores if s["mode_ok"] is not None]
    viol = f"{sum(s['violation'] for s in picks) / len(picks):>5.0%}" if picks else "    -"
    mode = f"{sum(mixed)}/{len(mixed)}" if mixed else "-"
    return (f"{len(scores):>4} {np.median(taus) if taus else float('nan'):>6.3f} {_stats(regrets)} "
            f"{viol} ({len(picks):>3} picks) {mode:>6}")


def ranking(rows: list[dict[str, Any]], ours: dict[str, tuple[float, float]],
            tool: dict[str, tuple[float, float]] | None) -> None:
    by = groups(rows)
    head = f"{'':<34} {'grps':>4} {'tau':>6} {'regret':>6} {'p90':>6} {'viol':>5} {'':>11} {'mode':>6}"
    for side, title in ((EVALUATION, "EVALUATION groups (scoring only)"), (CALIBRATION, "calibration groups")):
        print(f"\n{title}: per backend and group mode; median tau, median and p90 regret, violations, "
              "mode right / mixed groups")
        print(head)
        keyed: dict[str, list[tuple[dict[str, Any], ...]]] = collections.defaultdict(list)
        for key, g in sorted(by.items(), key=lambda kv: str(kv[0])):
            if key[0] != side:
                continue
            modes = {r["mode"] for r in g}
            kind = "both" if len(modes) > 1 else next(iter(modes))
            s_ours = score(g, ours)
            if s_ours is not None:
                keyed[f"modperf (own rows) {key[3]} {kind}"].append((s_ours,))
                keyed["modperf (own rows) all"].append((s_ours,))
            if tool is not None:
                both = {i: v for i, v in ours.items() if i in tool}
                a, b = score(g, both), score(g, {i: tool[i] for i in both})
                if a is not None and b is not None:
                    keyed[f"same rows {key[3]} {kind}"].append((a, b))
                    keyed["same rows all"].append((a, b))
        for name in sorted(keyed, key=lambda n: (not n.endswith(" all"), n)):
            pairs = keyed[name]
            if name.startswith("modperf"):
                print(f"{name:<34} {summary([p[0] for p in pairs])}")
            else:
                print(f"{name + ' modperf':<34} {summary([p[0] for p in pairs])}")
                print(f"{name + ' tool':<34} {summary([p[1] for p in pairs])}")


def misses(rows: list[dict[str, Any]], ours: dict[str, tuple[float, float]]) -> None:
    """What holds the evaluation regret back: per group with a violation or a regret above 20 %,
    the TPOT error (predicted / measured - 1) of the best measured row under the limit and of
    the pick. A best row predicted over the limit was passed over because its TPOT is
    over-predicted; a pick that violates was taken because its TPOT is under-predicted."""
    print("\nevaluation groups with a violation or a regret above 20 % (modperf): TPOT error of the best row under "
          "the limit / of the pick")
    passed_over, under, errors = 0, 0, []
    for key, g in sorted(groups(rows).items(), key=lambda kv: str(kv[0])):
        if key[0] != EVALUATION:
            continue
        s = score(g, ours)
        if s is None or not (s["violation"] or (s["regret"] or 0) > 0.2):
            continue
        got = [r for r in g if r["id"] in ours and shape(r) is not None]
        limit = float(np.median([r["silicon_tpot_ms"] for r in got]))

        def tps(r: dict[str, Any], t: float, p: float) -> float:
            conc, gpus = shape(r)  # type: ignore[misc]
            return tokens_per_s_per_gpu(conc, int(r["osl"]), t, p, gpus)

        best = max((r for r in got if r["silicon_tpot_ms"] <= limit),
                   key=lambda r: tps(r, r["silicon_ttft_ms"], r["silicon_tpot_ms"]))
        pick = max((r for r in got if ours[r["id"]][1] <= limit), key=lambda r: tps(r, *ours[r["id"]]))
        best_err = ours[best["id"]][1] / best["silicon_tpot_ms"] - 1
        pick_err = ours[pick["id"]][1] / pick["silicon_tpot_ms"] - 1
        passed_over += ours[best["id"]][1] > limit
        under += bool(s["violation"]) and pick_err < 0
        errors.append(best_err)
        print(f"  {key[1]} {key[2]} {key[3]} isl {key[4]} osl {key[5]}: {s['n']} rows, tau "
              f"{s['tau'] if s['tau'] is None else round(s['tau'], 2)}, "
              + ("violation" if s["violation"] else f"regret {s['regret']:.2f}")
              + f"; TPOT error {best_err:+.2f} / {pick_err:+.2f}")
    if errors:
        print(f"  {len(errors)} groups: the best row predicted over the limit in {passed_over} (its TPOT "
              f"over-predicted, median {np.median(errors):+.2f}); a violating pick's TPOT under-predicted in {under}")


# --- speed --------------------------------------------------------------------------------------


def price_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every row priced as ``bench/silicon.py`` prices it (its price_all)."""
    from silicon import price_all

    return price_all(modperf.open(), rows)


def _child(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str, int]:
    """(wall seconds, CPU seconds of the child, its stdout, exit code)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=3600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, proc.stdout, proc.returncode


def _modperf(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, dict[str, Any]]:
    wall, cpu, out, code = _child([sys.executable, "-m", "modperf", *argv], env)
    doc = json.loads(out) if out.strip() else {}
    if code not in (0, 1) or "counts" not in doc:
        raise SystemExit(f"modperf {' '.join(argv)} failed (exit {code}): {out[:300]}")
    return wall, cpu, doc


def _sizes(doc: dict[str, Any]) -> tuple[int, int]:
    totals = [doc["counts"][m]["total"] for m in doc["modes"]]
    return sum(t["enumerated"] for t in totals), sum(t["evaluated"] for t in totals)


def speed(runs: int) -> None:
    print("\nSPEED (child processes, same run; wall and CPU seconds)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            wall, cpu, out, _ = _child([TOOL_PYTHON, str(BENCH / "aiconfigurator_search.py"), f"{tmp}/aic{i}",
                                           "--", "cli", "default", *ISSUE])
            tool = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
            m_wall, m_cpu, doc = _modperf(SEARCH)
            rows.append((wall, cpu, tool, m_wall, m_cpu, doc))
    for wall, cpu, tool, m_wall, m_cpu, doc in rows:
        enumerated, evaluated = _sizes(doc)
        print(f"  aiconfigurator cli default: {wall:6.1f} s wall, {cpu:6.1f} s CPU; "
              f"{tool.get('agg_deployments', '?')} agg (layout, batch) deployments priced at "
              f"{tool.get('agg_points', '?')} (batch, prefill tokens) points; {tool.get('prefill_candidates', '?')} "
              f"prefill x {tool.get('decode_candidates', '?')} decode worker candidates paired by rate matching "
              f"({tool.get('static_points', '?')} static runs); exit {tool.get('exit')}")
        print(f"  modperf search (both modes): {m_wall:6.2f} s wall, {m_cpu:6.2f} s CPU; {enumerated:,} deployments "
              f"({evaluated:,} priced): {m_wall / wall:.3f}x the tool's wall time, {m_cpu / cpu:.3f}x its CPU")
    with tempfile.TemporaryDirectory() as cold:  # a first run: every table keyed from its file
        c_wall, c_cpu, doc = _modperf(SEARCH, {"MODPERF_CACHE_DIR": cold})
    print(f"  modperf search, first run (an empty cache folder: tables keyed from their files): {c_wall:.2f} s wall, "
          f"{c_cpu:.2f} s CPU: {c_wall / rows[0][0]:.3f}x the tool's wall time")
    for argv in LARGE:
        l_wall, l_cpu, doc = _modperf(argv)
        enumerated, evaluated = _sizes(doc)
        print(f"  modperf search, {doc['model']} on {doc['gpus']} x {doc['system']} {doc['backends'][0]}: "
              f"{enumerated:,} deployments ({evaluated:,} priced) in {l_wall:.1f} s wall, {l_cpu:.1f} s CPU (the "
              f"search alone: {doc['seconds']:.1f} s wall)")
    every = silicon_rows()
    c0, w0 = time.process_time(), time.perf_counter()
    priced = price_rows(every)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    answered = sum(not isinstance(p, E.ModperfError) for p in priced.values())
    print(f"  bench/silicon.py pricing: {len(every):,} rows ({answered:,} answered) in {wall:.1f} s wall, "
          f"{cpu:.1f} s CPU ({wall / len(every) * 1000:.2f} ms per row)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tool", action="store_true", help="also aiconfigurator's estimate of the same rows")
    parser.add_argument("--tool-cached-only", action="store_true", help="with --tool: only rows already cached")
    parser.add_argument("--jobs", type=int, default=2, help="tool child processes (default 2)")
    parser.add_argument("--skip-ranking", action="store_true")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--runs", type=int, default=1, help="speed: runs of the tool and the search (default 1)")
    args = parser.parse_args()
    if not args.skip_ranking:
        from silicon import USER_CONFIGS, predictions, substituted

        rows = silicon_rows()
        priced = price_rows(rows)
        # The constants each row's backend carries; strict answers only, as `modperf search`
        # prices (a row bench/silicon.py answers only with allow_substitute is left out), and a
        # disaggregated row without worker counts, answered TPOT only (no tokens/s/GPU to rank
        # by), is left out too.
        subs = substituted(priced)
        ours = {i: v for i, v in predictions(rows, priced).items() if v[0] is not None and i not in subs}
        sizes = [len(g) for g in groups(rows).values()]
        print(f"{len(rows):,} rows in {len(sizes)} (side, model, system, backend, isl, osl) groups, "
              f"{sum(s >= 3 for s in sizes)} of three rows or more; modperf answers {len(ours):,} rows")
        tool = None
        if args.tool:
            from silicon_tool import DEFAULT_CACHE, MAPPING, find_tool_python, load_cache, tool_answers

            python, version, tried = find_tool_python(TOOL_PYTHON)
            if python is None:
                print("aiconfigurator is not importable: " + "; ".join(tried))
            else:
                wanted = [r for g in groups(rows).values() if len(g) >= 3 for r in g]
                if args.tool_cached_only:
                    cached = load_cache(DEFAULT_CACHE, f"aiconfigurator=={version}; mapping {MAPPING}")
                    answers = {r["id"]: cached[r["id"]] for r in wanted if r["id"] in cached}
                    print(f"aiconfigurator {version}: {len(answers):,} of {len(wanted):,} rows cached (only those)")
                else:
                    answers, asked, seconds = tool_answers(wanted, python, str(version), USER_CONFIGS, args.jobs,
                                                           DEFAULT_CACHE, 120)
                    print(f"aiconfigurator {version}: {asked} rows asked in {seconds:.0f} s, the rest cached")
                tool = {i: (a["ttft_ms"], a["tpot_ms"]) for i, a in answers.items() if "ttft_ms" in a}
                print(f"aiconfigurator answers {len(tool):,} of them")
        ranking(rows, ours, tool)
        misses(rows, ours)
    if not args.skip_speed:
        speed(args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
