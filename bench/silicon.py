"""The scoreboard: modperf's TTFT / TPOT predictions against the measured deployments of the
corpus's ``systems/silicon_sample.csv``.

The split is fixed (issue 14; docs/serving.md): a row is **evaluation** when
``int(sha256(f"{model_path}|{system}|{backend}|{mode}").hexdigest()[:8], 16)`` is odd, otherwise
**calibration**. ``--fit`` fits the serving model's constants on calibration rows only (exact
re-exports of one measurement counted once) and writes them to
``src/modperf/serving_constants.py``; the headline is the evaluation rows.

Model ids of the file that the corpus does not bundle under that name are given to modperf the
way a user would, as a ``--model-configs`` folder (:data:`USER_CONFIGS`: the bench copies the
bundled config of the same architecture under the file's id; the row's quant modes say how it is
served). modperf itself never guesses one id for another.

    python bench/silicon.py                       # score every row with the fitted constants
    python bench/silicon.py --fit                 # fit on calibration rows, write the constants, score
    python bench/silicon.py --physics-only        # the op tables' step times as they are
    python bench/silicon.py --plot out/           # also predicted-vs-measured PNGs (log-log)
    python bench/silicon.py --limit 300           # a quick look (every n-th row)
    python bench/silicon.py --cv                  # the form choices: grouped CV on calibration rows
    python bench/silicon.py --tool                # also the best tool on the same rows (minutes)
    python bench/silicon.py --simulate            # the grouped CV that says whether the simulation or the
                                                  # closed form predicts calibration better, and both scored
    python bench/silicon.py --simulate --fit      # fit the simulation's constants on calibration rows, write
                                                  # src/modperf/simulation_constants.py, score both halves

``--tool`` puts aiconfigurator's own serving estimate beside modperf's on one fixed sample: the
evaluation rows of an 800-row stratified sample of the whole file (by system x backend x mode,
proportional, at least min(stratum size, 10) rows per stratum, numpy seed 0: 458 rows; the rule
in full is in bench/silicon_tool.py and docs/serving.md). The tool runs in ``--jobs`` child
processes (bench/aiconfigurator_serving.py) of an interpreter that has it installed
(``--tool-python``; by default the first of this one, /work/main/.venv/bin/python and
/work/scratch/aic-venv/bin/python on which ``import aiconfigurator.cli.api`` works); modperf
never imports it. Its answers are cached in ``--tool-cache`` (keyed by row id, tool version and
the bench's mapping revision), so a re-run asks only rows it has not answered. modperf's side
uses the fitted constants of src/modperf/serving_constants.py (never refitted here, whatever
``--fit`` wrote). Printed: each side's coverage, and on the rows both answered the median / p90
|relative error| and median signed error of TTFT and TPOT, overall and by mode, backend and
backend x mode; then the rows only one side answers, with the other's reason.

Prints tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import modperf
from modperf import errors as E
from modperf.predict import Priced, deployment_from_row, price, solve
from modperf.serving import Constants
from modperf.silicon import question, silicon_rows

REPO = Path(__file__).resolve().parent.parent
CONSTANTS_FILE = REPO / "src" / "modperf" / "serving_constants.py"

#: Ids of the file without a bundled config under that name -> the bundled config of the same
#: architecture (a user's --model-configs folder; the served dtypes come from the row).
USER_CONFIGS = {
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
    "zhipuai/GLM-5": "zai-org/GLM-5",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1",
    "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B",
}

#: The best tool's figures on 800 stratified rows, as issue 14 states them (aiconfigurator 0.12.0);
#: ``--tool`` measures it on the same rows instead.
TOOL = {"answered": 0.60, "ttft": (0.51, 0.93, -0.41), "tpot": (0.22, 0.74, None)}


def user_configs(folder: Path, db: modperf.Database) -> None:
    for wanted, bundled in USER_CONFIGS.items():
        if wanted in db.models.ids():
            continue
        source = db.models.get(bundled)
        (folder / (wanted.replace("/", "--") + "_config.json")).write_text(json.dumps(source.raw))


def cross_split_twins(rows: list[dict[str, Any]]) -> set[str]:
    """Evaluation rows whose (ttft, tpot) measurement also appears on a calibration row (a
    re-export of one benchmark under another id): reported with and without them."""
    by_pair = collections.defaultdict(set)
    for r in rows:
        by_pair[(r["silicon_ttft_ms"], r["silicon_tpot_ms"])].add(r["split"])
    return {r["id"] for r in rows if r["split"] == "eval" and by_pair[(r["silicon_ttft_ms"], r["silicon_tpot_ms"])]
            == {"eval", "calib"}}


def noise_floor(rows: list[dict[str, Any]]) -> tuple[float, float, float, float]:
    """Rows repeating one configuration (every deployment column and the version), exact
    re-exports removed: |x / group median - 1|, median and p90, for TTFT and TPOT."""
    seen, groups = set(), collections.defaultdict(list)
    for r in rows:
        pair = (r["silicon_ttft_ms"], r["silicon_tpot_ms"])
        if pair in seen:
            continue
        seen.add(pair)
        key = json.dumps(question({**r, "id": None}), sort_keys=True, default=str)
        groups[key].append(pair)
    dev_t, dev_p = [], []
    for pairs in groups.values():
        if len(pairs) < 2:
            continue
        t = np.array([p[0] for p in pairs])
        p = np.array([p[1] for p in pairs])
        dev_t += list(np.abs(t / np.median(t) - 1))
        dev_p += list(np.abs(p / np.median(p) - 1))
    return (float(np.median(dev_t)), float(np.percentile(dev_t, 90)), float(np.median(dev_p)),
            float(np.percentile(dev_p, 90)))


def price_all(db: modperf.Database, rows: list[dict[str, Any]]) -> dict[str, Priced | E.ModperfError]:
    out: dict[str, Priced | E.ModperfError] = {}
    start = time.perf_counter()
    for i, r in enumerate(rows):
        try:
            out[r["id"]] = price(db, deployment_from_row(question(r)))
        except E.ModperfError as exc:
            out[r["id"]] = exc
        if (i + 1) % 500 == 0:
            print(f"  priced {i + 1}/{len(rows)} rows in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return out


def predictions(rows, priced, constants: dict[str, Any]) -> dict[str, tuple[float, float]]:
    out = {}
    for r in rows:
        p = priced[r["id"]]
        if not isinstance(p, Priced):
            continue
        c = constants["disagg"] if r["mode"] == "disagg" else constants["agg"].get(r["backend"], Constants())
        pred = solve(p, c, "")
        out[r["id"]] = (pred.ttft_ms, pred.tpot_ms)
    return out


# --- fitting ------------------------------------------------------------------------------------


def _loss(rows, priced, make) -> float:
    errs = []
    for r in rows:
        pred = solve(priced[r["id"]], make, "")
        errs.append(abs(math.log(pred.ttft_ms / r["silicon_ttft_ms"])) + abs(math.log(pred.tpot_ms / r["silicon_tpot_ms"])))
    return float(np.mean(errs))


def calibration_rows(rows, priced, mode: str | None = None) -> list[dict[str, Any]]:
    """The calibration rows the constants may be fitted on: priced, of ``mode`` when given, and
    one measurement re-exported under several ids counted once."""
    calib, seen = [], set()
    for r in rows:
        pair = (r["silicon_ttft_ms"], r["silicon_tpot_ms"])
        if r["split"] != "calib" or (mode and r["mode"] != mode) or pair in seen \
                or not isinstance(priced[r["id"]], Priced):
            continue
        seen.add(pair)
        calib.append(r)
    return calib


def bounded(x) -> Constants:
    """Constants from an optimiser's vector, inside their bounds: s in [0.3, 3], tau0 in
    [0, 1000] ms, kappa in [0, 1]; a fifth value is steps_waited in [0.5, 10]."""
    s_pre, s_dec, tau0, kappa, *rest = (float(v) for v in x)
    return Constants(min(max(s_pre, 0.3), 3.0), min(max(s_dec, 0.3), 3.0), min(max(tau0, 0.0), 1000.0),
                     min(max(kappa, 0.0), 1.0), *(min(max(v, 0.5), 10.0) for v in rest))


def fit_group(group, priced, x0: list[float]) -> Constants:
    """Nelder-Mead on the mean |log error| of TTFT plus TPOT over ``group``."""
    from scipy.optimize import minimize

    res = minimize(lambda x: _loss(group, priced, bounded(x)), x0=x0, method="Nelder-Mead",
                   options={"maxiter": 400, "xatol": 1e-3, "fatol": 1e-5})
    return bounded(res.x)


def fit(rows, priced) -> tuple[dict[str, Constants], Constants, dict[str, int]]:
    calib = calibration_rows(rows, priced)
    counts: dict[str, int] = {}

    def rounded(c: Constants) -> Constants:
        return Constants(*(round(float(v), 4) for v in (c.s_pre, c.s_dec, c.tau0_ms, c.kappa)))

    agg: dict[str, Constants] = {}
    for backend in sorted({r["backend"] for r in calib if r["mode"] == "agg"}):
        group = [r for r in calib if r["mode"] == "agg" and r["backend"] == backend]
        counts[f"agg {backend}"] = len(group)
        agg[backend] = rounded(fit_group(group, priced, [1.0, 1.0, 100.0, 0.3]))
    group = [r for r in calib if r["mode"] == "disagg"]
    counts["disagg"] = len(group)
    return agg, rounded(fit_group(group, priced, [1.0, 1.0, 200.0, 0.3])), counts


def write_constants(agg: dict[str, Constants], disagg: Constants, counts: dict[str, int]) -> None:
    stamp = time.strftime("%Y-%m-%d")
    lines = [
        '"""The serving model\'s fitted constants (docs/serving.md lists each with its value).',
        "",
        "Written by ``python bench/silicon.py --fit`` from the CALIBRATION rows of the corpus's",
        "silicon_sample.csv only (the split rule is in docs/serving.md); never edited by hand.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from .serving import Constants",
        "",
        "AGG: dict[str, Constants] = {",
    ]
    for backend, c in agg.items():
        lines.append(f'    "{backend}": Constants(s_pre={c.s_pre}, s_dec={c.s_dec}, tau0_ms={c.tau0_ms}, '
                     f"kappa={c.kappa}),")
    lines.append("}")
    lines.append(f"DISAGG: Constants | None = Constants(s_pre={disagg.s_pre}, s_dec={disagg.s_dec}, "
                 f"tau0_ms={disagg.tau0_ms}, kappa={disagg.kappa})")
    agg_rows = ", ".join(f"{k.split()[1]} {v}" for k, v in counts.items() if k.startswith("agg"))
    lines.append("PROVENANCE: dict[str, str] = {")
    lines.append(f'    "agg": "fitted {stamp} on calibration rows of silicon_sample.csv "')
    lines.append(f'           "({agg_rows}; re-exports once)",')
    lines.append(f'    "disagg": "fitted {stamp} on {counts["disagg"]} calibration rows of silicon_sample.csv '
                 '(re-exports once)",')
    lines.append("}")
    CONSTANTS_FILE.write_text("\n".join(lines) + "\n")


def cross_validate(rows, priced, db, folds: int = 4) -> None:
    """Grouped k-fold cross-validation on calibration rows only (aggregated; folds by model x
    system x backend): the evidence for the serving model's form choices (docs/serving.md)."""
    import random

    from modperf.predict import ffn_has_moe

    calib = calibration_rows(rows, priced, "agg")
    moe = {m: ffn_has_moe(db.models.get(m)) for m in {r["model_path"] for r in calib}}
    groups = sorted({(r["model_path"], r["system"], r["backend"]) for r in calib})
    random.Random(0).shuffle(groups)
    forms = {"per backend (kept)": (lambda r: r["backend"], False),
             "per backend x {dense, MoE}": (lambda r: (r["backend"], moe[r["model_path"]]), False),
             "per backend, steps_waited fitted": (lambda r: r["backend"], True)}
    print(f"\ngrouped {folds}-fold cross-validation on {len(calib)} calibration rows (aggregated)")
    for name, (key, free_steps) in forms.items():
        errs: list[tuple[float, float]] = []
        for k in range(folds):
            held = {g for i, g in enumerate(groups) if i % folds == k}
            train = [r for r in calib if (r["model_path"], r["system"], r["backend"]) not in held]
            x0 = [1.0, 1.0, 100.0, 0.3] + ([0.5] if free_steps else [])
            fitted = {kk: fit_group([r for r in train if key(r) == kk], priced, x0) for kk in {key(r) for r in train}}
            for r in calib:
                if (r["model_path"], r["system"], r["backend"]) in held:
                    c = fitted.get(key(r)) or next((v for kk, v in fitted.items() if r["backend"] in str(kk)),
                                                   Constants())
                    pred = solve(priced[r["id"]], c, "")
                    errs.append((pred.ttft_ms / r["silicon_ttft_ms"] - 1, pred.tpot_ms / r["silicon_tpot_ms"] - 1))
        t = np.abs([e[0] for e in errs])
        p = np.abs([e[1] for e in errs])
        print(f"  {name:<36} TTFT {np.median(t):.2f} / {np.percentile(t, 90):.2f}   "
              f"TPOT {np.median(p):.2f} / {np.percentile(p, 90):.2f}")


# --- scoring ------------------------------------------------------------------------------------


def _stats(pairs: list[tuple[float, float]]) -> tuple[float, float, float]:
    rel = np.array([p / m - 1 for p, m in pairs])
    return float(np.median(np.abs(rel))), float(np.percentile(np.abs(rel), 90)), float(np.median(rel))


def score_table(title: str, rows, preds, by) -> None:
    groups = collections.defaultdict(list)
    for r in rows:
        groups[by(r)].append(r)
    print(f"\n{title}")
    print(f"{'group':<44} {'rows':>5} {'answered':>8}   {'TTFT med':>8} {'p90':>6} {'signed':>7}   "
          f"{'TPOT med':>8} {'p90':>6} {'signed':>7}")
    for key in sorted(groups, key=str):
        g = groups[key]
        got = [r for r in g if r["id"] in preds]
        line = f"{str(key):<44} {len(g):>5} {len(got) / len(g):>8.0%}"
        if got:
            t = _stats([(preds[r["id"]][0], r["silicon_ttft_ms"]) for r in got])
            p = _stats([(preds[r["id"]][1], r["silicon_tpot_ms"]) for r in got])
            line += f"   {t[0]:>8.2f} {t[1]:>6.2f} {t[2]:>+7.2f}   {p[0]:>8.2f} {p[1]:>6.2f} {p[2]:>+7.2f}"
        print(line)


def refusals(rows, priced) -> None:
    reasons = collections.Counter()
    for r in rows:
        p = priced[r["id"]]
        if not isinstance(p, Priced):
            reasons[f"{type(p).__name__}: {p.detail[:90]}"] += 1
    print("\nnot answered (evaluation rows), by reason:")
    for reason, n in reasons.most_common(15):
        print(f"  {n:>5}  {reason}")


def plot(folder: Path, rows, preds) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    colours = {"sglang": "tab:orange", "trtllm": "tab:green", "vllm": "tab:blue"}
    for i, metric in enumerate(("ttft", "tpot")):
        fig, ax = plt.subplots(figsize=(6, 6))
        for backend, colour in colours.items():
            got = [r for r in rows if r["id"] in preds and r["backend"] == backend]
            ax.scatter([r[f"silicon_{metric}_ms"] for r in got], [preds[r["id"]][i] for r in got], s=6,
                       alpha=0.5, c=colour, label=backend)
        lo = min(ax.get_xlim()[0], ax.get_ylim()[0])
        hi = max(ax.get_xlim()[1], ax.get_ylim()[1])
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {metric.upper()} (ms)")
        ax.set_ylabel(f"predicted {metric.upper()} (ms)")
        ax.set_title(f"{metric.upper()}: evaluation rows")
        ax.legend()
        fig.savefig(folder / f"silicon_{metric}.png", dpi=120)
        plt.close(fig)
    print(f"\nplots: {folder}/silicon_ttft.png, {folder}/silicon_tpot.png")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit", action="store_true", help="fit the constants on calibration rows and write them")
    parser.add_argument("--physics-only", action="store_true", help="score without fitted constants")
    parser.add_argument("--plot", type=Path, help="write predicted-vs-measured PNGs to this folder")
    parser.add_argument("--limit", type=int, help="every n-th row, about this many (a quick look)")
    parser.add_argument("--cv", action="store_true", help="cross-validate the serving model's forms on calibration "
                        "rows (grouped folds) and stop")
    parser.add_argument("--simulate", action="store_true", help="score the request-level simulation's means beside "
                        "the closed form on both halves, cross-validate both on calibration rows, and stop "
                        "(bench/silicon_simulate.py)")
    parser.add_argument("--no-simulate-cv", action="store_true", help="with --simulate: no cross-validation")
    parser.add_argument("--simulate-forms", choices=("kept", "all"), default="kept", help="with --simulate: "
                        "cross-validate the kept simulation form only (default) or every form")
    parser.add_argument("--tool", action="store_true", help="also aiconfigurator on the stratified sample's rows")
    parser.add_argument("--tool-sample", type=int, default=800, help="rows of the whole file sampled (default 800)")
    parser.add_argument("--tool-python", help="interpreter with aiconfigurator installed (default: the first found)")
    parser.add_argument("--tool-cache", type=Path, default=None, help="JSON-lines cache of the tool's answers "
                        "(default /tmp/modperf_tool_answers.jsonl)")
    parser.add_argument("--tool-timeout", type=int, default=120, help="seconds the tool may take on one row")
    parser.add_argument("--jobs", type=int, default=2, help="tool child processes (default 2)")
    args = parser.parse_args()

    every = silicon_rows()
    rows = every
    if args.limit:
        rows = rows[:: max(1, len(rows) // args.limit)]
    sample = []
    if args.tool:
        from silicon_tool import evaluation_sample

        sample = evaluation_sample(every, args.tool_sample)
        listed = {r["id"] for r in rows}
        rows_priced = rows + [r for r in sample if r["id"] not in listed]
    else:
        rows_priced = rows
    with tempfile.TemporaryDirectory() as tmp:
        db = modperf.open()
        user_configs(Path(tmp), db)
        db = modperf.open(model_configs=[tmp])
        start = time.perf_counter()
        priced = price_all(db, rows_priced)
        seconds = time.perf_counter() - start
    print(f"priced {len(rows_priced)} rows in {seconds:.1f} s ({seconds / len(rows_priced) * 1000:.1f} ms per row)")
    if args.cv:
        cross_validate(rows_priced, priced, db)
        return 0
    if args.simulate:
        from silicon_simulate import simulate_mode

        from modperf import serving_constants as sc

        simulate_mode(rows, priced, {"agg": sc.AGG}, cv=not args.no_simulate_cv, fit=args.fit,
                      all_forms=args.simulate_forms == "all")
        return 0
    if args.fit:
        agg, disagg, counts = fit(rows, priced)
        write_constants(agg, disagg, counts)
        print(f"fitted on calibration rows {counts}; wrote {CONSTANTS_FILE}")
        constants = {"agg": agg, "disagg": disagg}
    elif args.physics_only:
        constants = {"agg": {}, "disagg": Constants()}
    else:
        from modperf import serving_constants as sc

        constants = {"agg": sc.AGG, "disagg": sc.DISAGG or Constants()}
    for backend, c in sorted(constants["agg"].items()):
        print(f"  agg {backend}: {c}")
    print(f"  disagg: {constants['disagg']}")
    preds = predictions(rows, priced, constants)
    evaluation = [r for r in rows if r["split"] == "eval"]
    twins = cross_split_twins(rows)
    score_table("HEADLINE: evaluation rows (all; then without cross-split re-exports; then calibration)",
                rows, preds, lambda r: "evaluation" if r["split"] == "eval" else "calibration")
    score_table("evaluation rows without the re-exports of calibration measurements",
                [r for r in evaluation if r["id"] not in twins], preds, lambda r: "evaluation (no twins)")
    score_table("evaluation, by backend x mode", evaluation, preds, lambda r: f"{r['backend']} {r['mode']}")
    score_table("evaluation, by system", evaluation, preds, lambda r: r["system"])
    score_table("evaluation, by model", evaluation, preds, lambda r: r["model_path"])
    nf = noise_floor(rows)
    print(f"\nnoise floor (repeated configurations, re-exports removed): TTFT |x/median-1| median {nf[0]:.3f} "
          f"p90 {nf[1]:.3f}; TPOT median {nf[2]:.3f} p90 {nf[3]:.3f}")
    print(f"best tool (issue 14, 800 stratified rows): answered {TOOL['answered']:.0%}; TTFT {TOOL['ttft'][0]} / "
          f"{TOOL['ttft'][1]} signed {TOOL['ttft'][2]}; TPOT {TOOL['tpot'][0]} / {TOOL['tpot'][1]}")
    refusals(evaluation, priced)
    if args.plot:
        plot(args.plot, evaluation, preds)
    if args.tool:
        from modperf import serving_constants as sc

        fitted = {"agg": sc.AGG, "disagg": sc.DISAGG or Constants()}
        return versus_tool(args, sample, priced, predictions(sample, priced, fitted))
    return 0


def versus_tool(args: argparse.Namespace, sample: list[dict[str, Any]], priced: dict[str, Priced | E.ModperfError],
                ours: dict[str, tuple[float, float]]) -> int:
    """``--tool``: the best tool and modperf (fitted constants) on the same rows."""
    from silicon_tool import DEFAULT_CACHE, find_tool_python, one_side_only, own_rows, side_by_side, tool_answers

    print(f"\nTHE BEST TOOL ON THE SAME ROWS: the {len(sample)} evaluation rows of the {args.tool_sample}-row "
          "stratified sample (system x backend x mode, seed 0); modperf with its fitted constants")
    python, version, tried = find_tool_python(args.tool_python)
    if python is None:
        print("aiconfigurator is not importable by any interpreter tried; the tool part is skipped "
              "(install aiconfigurator in one and pass --tool-python):")
        for line in tried:
            print(f"  {line}")
        return 0
    cache = args.tool_cache or DEFAULT_CACHE
    answers, asked, seconds = tool_answers(sample, python, str(version), USER_CONFIGS, args.jobs, cache,
                                           args.tool_timeout)
    name = f"aiconfigurator {version}"
    print(f"{name} ({python}): {asked} rows asked in {seconds:.0f} s on {args.jobs} processes"
          + (f" ({seconds / asked:.2f} s per row, wall)" if asked else "")
          + f"; {len(sample) - asked} from the cache {cache}")
    tool = {i: (a["ttft_ms"], a["tpot_ms"]) for i, a in answers.items() if "ttft_ms" in a}
    tool_reason = {i: a["error"] for i, a in answers.items() if "error" in a}
    ours_reason = {r["id"]: f"{type(p).__name__}: {p.detail}" for r in sample
                   if not isinstance(p := priced[r["id"]], Priced)}
    side_by_side(sample, ours, tool, name)
    print()
    own_rows(sample, ours, "modperf")
    own_rows(sample, tool, name)
    one_side_only(sample, ours_reason, tool_reason, ours, tool)
    return 0


if __name__ == "__main__":
    sys.exit(main())
