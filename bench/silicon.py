"""The scoreboard: modperf's TTFT / TPOT predictions against the measured deployments of the
corpus's ``systems/silicon_sample.csv``.

The split is fixed (issue 14; docs/serving.md): a row is **evaluation** when
``int(sha256(f"{model_path}|{system}|{backend}|{mode}").hexdigest()[:8], 16)`` is odd, otherwise
**calibration**. ``--fit`` fits the serving model's constants on calibration rows only (exact
re-exports of one measurement counted once; ``modperf.serving.fit``) and writes them into the
fitted block of each backend's module (``src/modperf/serving/{vllm,sglang,trtllm}.py``); the
headline is the evaluation rows.

Model ids of the file that the corpus does not bundle under that name (a renamed repository, a
served variant) are asked as the file writes them: modperf resolves each to its bundled config
(modperf.specs.model_names: a table of known names with their sources, never a guess), and the row's
quant modes say how it is served.

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
                                                  # src/modperf/serving/simulation_constants.py, score both halves

``--tool`` puts aiconfigurator's own serving estimate beside modperf's on one fixed sample: the
evaluation rows of an 800-row stratified sample of the whole file (by system x backend x mode,
proportional, at least min(stratum size, 10) rows per stratum, numpy seed 0: 458 rows; the rule
in full is in bench/silicon_tool.py and docs/serving.md). The tool runs in ``--jobs`` child
processes (bench/aiconfigurator_serving.py) of an interpreter that has it installed
(``--tool-python``; by default the first of this one, /work/main/.venv/bin/python and
/work/scratch/aic-venv/bin/python on which ``import aiconfigurator.cli.api`` works); modperf
never imports it. Its answers are cached in ``--tool-cache`` (keyed by row id, tool version and
the bench's mapping revision), so a re-run asks only rows it has not answered. modperf's side
uses the fitted constants the backends' modules carry (never refitted here, whatever
``--fit`` wrote), strict answers only (a row modperf answers only with ``allow_substitute`` counts
as not answered here). Printed: each side's coverage, and on the rows both answered the median / p90
|relative error| and median signed error of TTFT and TPOT, overall and by mode, backend and
backend x mode; then the rows only one side answers, with the other's reason.

Prints tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
from silicon_tool import stats

import modperf
from modperf import errors as E
from modperf.serving import BACKENDS, Constants, backend_of, generation_of
from modperf.serving.fit import FitResult
from modperf.serving.predict import Priced, solve
from modperf.serving.silicon import calibration_rows, fit_constants, price_rows, question, silicon_rows
from modperf.specs.model_names import KNOWN_NAMES

REPO = Path(__file__).resolve().parent.parent
SERVING = REPO / "src" / "modperf" / "serving"
#: The block of a backend's module that ``--fit`` rewrites.
BEGIN = "# --- fitted constants: written by `python bench/silicon.py --fit` from calibration rows only ---"
END = "# --- end of fitted constants ---"

#: Ids of the file without a bundled config under that name -> the bundled config of the same
#: geometry, for the tool (which is given that config under the file's id); modperf resolves
#: these names itself (modperf.specs.model_names, the one home of the mapping).
USER_CONFIGS = {name: target.partition("@")[0] for name, (target, _) in KNOWN_NAMES.items()
                if name in {"meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-8B-Instruct",
                            "nvidia/Llama-3.1-8B-Instruct-FP8", "zhipuai/GLM-5", "nvidia/DeepSeek-R1-NVFP4",
                            "nvidia/Qwen3-32B-NVFP4"}}

#: The best tool's figures on 800 stratified rows, as issue 14 states them (aiconfigurator 0.12.0);
#: ``--tool`` measures it on the same rows instead.
TOOL = {"answered": 0.60, "ttft": (0.51, 0.93, -0.41), "tpot": (0.22, 0.74, None)}


def cross_split_twins(rows: list[dict[str, Any]]) -> set[str]:
    """Evaluation rows whose (ttft, tpot) measurement also appears on a calibration row (a
    re-export of one benchmark under another id): reported with and without them."""
    by_pair = collections.defaultdict(set)
    for r in rows:
        by_pair[(r["silicon_ttft_ms"], r["silicon_tpot_ms"])].add(r["split"])
    return {r["id"] for r in rows if r["split"] == "eval" and by_pair[(r["silicon_ttft_ms"], r["silicon_tpot_ms"])]
            == {"eval", "calib"}}


def noise_floor(rows: list[dict[str, Any]], concurrency: bool = False) -> tuple[float, float, float, float]:
    """Rows repeating one configuration (every deployment column and the version; with
    ``concurrency``, also a disaggregated row's concurrency from its provenance column, which
    tells apart the rows without worker counts), exact re-exports removed: |x / group median -
    1|, median and p90, for TTFT and TPOT."""
    seen, groups = set(), collections.defaultdict(list)
    for r in rows:
        pair = (r["silicon_ttft_ms"], r["silicon_tpot_ms"])
        if pair in seen:
            continue
        seen.add(pair)
        line = question({**r, "id": None})
        if not concurrency:
            line.pop("concurrency", None)
        key = json.dumps(line, sort_keys=True, default=str)
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
    """Every row priced (``modperf.serving.silicon.price_rows``). The query engine's plan persistence is
    off: the rows ask thousands of one-off step shapes, and persisting each group's plan (every
    write walks the cache folder to bound it) cost more than the pricing (docs/performance.md)."""
    db.queries.plans = None
    start = time.perf_counter()

    def progress(i: int) -> None:
        if (i + 1) % 500 == 0:
            print(f"  priced {i + 1}/{len(rows)} rows in {time.perf_counter() - start:.0f} s", file=sys.stderr)

    return price_rows(db, rows, progress=progress)


#: Constants per row: the fitted ones its backend carries (None), physics only (``"physics"``),
#: or a {backend: FitResult} map of constants being tried (a fit, a fold of the CV).
ConstantsChoice = "str | dict[str, FitResult] | None"


def row_constants(r: dict[str, Any], choice: Any = None) -> Constants:
    if choice == "physics":
        return Constants()
    if choice is None:
        return backend_of(r["backend"]).constants(r["mode"], r["system"])[0]
    result = choice.get(r["backend"])
    if result is None:
        return Constants()
    gen = generation_of(r["system"]) or ""
    return result.sets.get((r["mode"], gen)) or result.sets.get((r["mode"], "*")) or Constants()


def predictions(rows, priced, choice: Any = None) -> dict[str, tuple[float | None, float]]:
    out = {}
    for r in rows:
        p = priced[r["id"]]
        if not isinstance(p, Priced):
            continue
        pred = solve(p, row_constants(r, choice), "")
        out[r["id"]] = (pred.ttft_ms, pred.tpot_ms)
    return out


# --- fitting ------------------------------------------------------------------------------------


def fit(rows, priced, generation: Any = "system", host_floor: bool = True,
        disagg_host_floor: bool = False) -> dict[str, FitResult]:
    return fit_constants(rows, priced, generation, host_floor, disagg_host_floor)


def write_constants(results: dict[str, FitResult]) -> None:
    """Rewrite the fitted block of each backend's module (between BEGIN and END)."""
    stamp = time.strftime("%Y-%m-%d")
    for backend, result in results.items():
        module = SERVING / f"{backend}.py"
        text = module.read_text()
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        cls = type(BACKENDS[backend]).__name__
        lines = [BEGIN, f"{cls}.fitted = Fitted(", "    sets={"]
        for (mode, gen), c in result.sets.items():
            lines.append(f'        ("{mode}", "{gen}"): Constants(s_pre={c.s_pre}, s_dec={c.s_dec}, '
                         f"tau0_ms={c.tau0_ms}, kappa={c.kappa}, host_op_ms={c.host_op_ms}),")
        lines += ["    },", "    what={"]
        for (mode, gen), what in result.what.items():
            pieces = textwrap.wrap(what, 76, drop_whitespace=False)
            lines.append(f'        ("{mode}", "{gen}"): "{pieces[0]}"' + ("," if len(pieces) == 1 else ""))
            last = len(pieces) - 2
            lines += [f'            "{piece}"' + ("," if i == last else "") for i, piece in enumerate(pieces[1:])]
        lines += ["    },", f'    date="{stamp}",', ")", END]
        module.write_text(head + "\n".join(lines) + tail)


def cross_validate(rows, priced, folds: int = 4) -> None:
    """Grouped k-fold cross-validation on calibration rows only (folds by model x system x
    backend): the evidence for the serving model's form choices (docs/serving.md)."""
    import random

    calib = calibration_rows(rows, priced)
    groups = sorted({(r["model_path"], r["system"], r["backend"]) for r in calib})
    random.Random(0).shuffle(groups)
    forms = {"agg step per backend x generation, host floor; disagg no host floor (kept)": ("system", True, False),
             "agg step per backend x generation, no host floor": ("system", False, False),
             "agg step per backend (all generations), host floor": ("all", True, False),
             "disagg with a host floor": ("system", True, True)}
    print(f"\ngrouped {folds}-fold cross-validation on {len(calib)} calibration rows")
    for name, (generation, host_floor, disagg_floor) in forms.items():
        errs: dict[str, list[tuple[float | None, float, float, float]]] = collections.defaultdict(list)
        for k in range(folds):
            held = {g for i, g in enumerate(groups) if i % folds == k}
            train = [r for r in calib if (r["model_path"], r["system"], r["backend"]) not in held]
            fitted = fit(train, priced, generation, host_floor, disagg_floor)
            if generation != "system":  # one set for every generation: look it up as such
                fitted = {b: FitResult({**{(m, g2): c for (m, g), c in f.sets.items() if g == "all"
                                           for g2 in ("hopper", "blackwell", "*")},
                                        **{k: c for k, c in f.sets.items() if k[0] == "disagg"}}, {})
                          for b, f in fitted.items()}
            for r in calib:
                if (r["model_path"], r["system"], r["backend"]) in held:
                    pred = solve(priced[r["id"]], row_constants(r, fitted), "")
                    errs[r["mode"]].append((None if pred.ttft_ms is None else pred.ttft_ms / r["silicon_ttft_ms"] - 1,
                                            pred.tpot_ms / r["silicon_tpot_ms"] - 1, 0.0, 0.0))
        for mode, e in sorted(errs.items()):
            t = np.abs([x[0] for x in e if x[0] is not None])
            p = np.abs([x[1] for x in e])
            print(f"  {name:<78} {mode:<7} n={len(e):>4}  TTFT {np.median(t):.3f} / {np.percentile(t, 90):.3f}   "
                  f"TPOT {np.median(p):.3f} / {np.percentile(p, 90):.3f}")


# --- scoring ------------------------------------------------------------------------------------


def score_table(title: str, rows, preds, by) -> None:
    groups = collections.defaultdict(list)
    for r in rows:
        groups[by(r)].append(r)
    print(f"\n{title}")
    print(f"{'group':<44} {'rows':>5} {'answered':>8} {'TTFT':>5}   {'TTFT med':>8} {'p90':>6} {'signed':>7}   "
          f"{'TPOT med':>8} {'p90':>6} {'signed':>7}")
    for key in sorted(groups, key=str):
        g = groups[key]
        got = [r for r in g if r["id"] in preds]
        with_ttft = [r for r in got if preds[r["id"]][0] is not None]
        line = f"{key!s:<44} {len(g):>5} {len(got) / len(g):>8.0%} {len(with_ttft) / len(g):>5.0%}"
        if got:
            t = stats([(preds[r["id"]][0], r["silicon_ttft_ms"]) for r in got])
            p = stats([(preds[r["id"]][1], r["silicon_tpot_ms"]) for r in got])
            line += f"   {t[0]:>8.2f} {t[1]:>6.2f} {t[2]:>+7.2f}   {p[0]:>8.2f} {p[1]:>6.2f} {p[2]:>+7.2f}"
        print(line)


def substituted(priced) -> set[str]:
    """Rows answered only with ``allow_substitute``."""
    return {k for k, p in priced.items() if isinstance(p, Priced) and p.substitutions}


def assumed(priced) -> set[str]:
    """Rows answered on an assumed topology (a disaggregated row's decode batch from its
    concurrency alone: ``Priced.assumptions``)."""
    return {k for k, p in priced.items() if isinstance(p, Priced) and p.assumptions}


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
    db = modperf.open()
    start = time.perf_counter()
    priced = price_all(db, rows_priced)
    seconds = time.perf_counter() - start
    print(f"priced {len(rows_priced)} rows in {seconds:.1f} s ({seconds / len(rows_priced) * 1000:.1f} ms per row)")
    if args.cv:
        cross_validate(rows_priced, priced)
        return 0
    if args.simulate:
        from silicon_simulate import simulate_mode

        simulate_mode(rows, priced, cv=not args.no_simulate_cv, fit=args.fit, all_forms=args.simulate_forms == "all")
        return 0
    choice: Any = None
    if args.fit:
        start = time.perf_counter()
        results = fit(rows, priced)
        write_constants(results)
        print(f"fitted on calibration rows in {time.perf_counter() - start:.1f} s; wrote {SERVING}/<backend>.py")
        choice = results
    elif args.physics_only:
        choice = "physics"
    for backend in sorted(BACKENDS):
        for mode in ("agg", "disagg"):
            for system in ("h200_sxm", "b200_sxm"):
                c = row_constants({"backend": backend, "mode": mode, "system": system}, choice)
                print(f"  {backend} {mode} {generation_of(system)}: {c}")
    preds = predictions(rows, priced, choice)
    evaluation = [r for r in rows if r["split"] == "eval"]
    twins = cross_split_twins(rows)
    subs = substituted(priced)
    guessed = assumed(priced)
    every_pred, preds = preds, {k: v for k, v in preds.items() if k not in subs and k not in guessed}
    score_table("HEADLINE: evaluation rows (all; then without cross-split re-exports; then calibration); strict "
                "answers (no substitution)", rows, preds, lambda r: "evaluation" if r["split"] == "eval"
                else "calibration")
    half = {"eval": "evaluation", "calib": "calibration"}
    score_table("the same with the substituted rows (allow_substitute) counted as answered; then those rows alone",
                rows, {k: v for k, v in every_pred.items() if k not in guessed},
                lambda r: half[r["split"]] + " strict + substituted")
    score_table("", [r for r in rows if r["id"] in subs], every_pred,
                lambda r: ("evaluation" if r["split"] == "eval" else "calibration") + " substituted only")
    score_table("the disaggregated rows without worker counts answered on the assumed decode batch (TPOT only; "
                "never fitted on): with the strict rows; with the strict and substituted rows; then alone, by "
                "backend x mode", rows, {k: v for k, v in every_pred.items() if k not in subs},
                lambda r: half[r["split"]] + " strict + assumed")
    score_table("", rows, every_pred, lambda r: half[r["split"]] + " strict + substituted + assumed")
    score_table("", [r for r in rows if r["id"] in guessed], every_pred,
                lambda r: f"{half[r['split']]} assumed only, {r['backend']} {r['mode']}")
    score_table("evaluation rows without the re-exports of calibration measurements",
                [r for r in evaluation if r["id"] not in twins], preds, lambda r: "evaluation (no twins)")
    score_table("evaluation, by backend x mode", evaluation, preds, lambda r: f"{r['backend']} {r['mode']}")
    score_table("evaluation, by system", evaluation, preds, lambda r: r["system"])
    score_table("evaluation, by model", evaluation, preds, lambda r: r["model_path"])
    nf = noise_floor(rows)
    print(f"\nnoise floor (repeated configurations, re-exports removed): TTFT |x/median-1| median {nf[0]:.3f} "
          f"p90 {nf[1]:.3f}; TPOT median {nf[2]:.3f} p90 {nf[3]:.3f}")
    nf = noise_floor(rows, concurrency=True)
    print(f"the same, disaggregated rows also keyed by their concurrency: TTFT median {nf[0]:.3f} p90 {nf[1]:.3f}; "
          f"TPOT median {nf[2]:.3f} p90 {nf[3]:.3f}")
    print(f"best tool (issue 14, 800 stratified rows): answered {TOOL['answered']:.0%}; TTFT {TOOL['ttft'][0]} / "
          f"{TOOL['ttft'][1]} signed {TOOL['ttft'][2]}; TPOT {TOOL['tpot'][0]} / {TOOL['tpot'][1]}")
    refusals(evaluation, priced)
    if args.plot:
        plot(args.plot, evaluation, preds)
    if args.tool:  # strict answers against the tool; the substituted ones are scored apart above
        strict = {k: (v if k not in subs else E.NotCoveredError("answered only with allow_substitute"))
                  for k, v in priced.items()}
        strict = {k: (v if k not in guessed else E.QueryFieldError("answered only on an assumed decode batch"))
                  for k, v in strict.items()}
        return versus_tool(args, sample, strict, predictions(sample, strict))
    return 0


def versus_tool(args: argparse.Namespace, sample: list[dict[str, Any]], priced: dict[str, Priced | E.ModperfError],
                ours: dict[str, tuple[float | None, float]]) -> int:
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
