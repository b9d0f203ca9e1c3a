"""The best tool on the scoreboard's rows: the stratified sample, the child processes that ask
aiconfigurator, the answers' cache, and the side-by-side table. Used by ``bench/silicon.py
--tool``; nothing here imports aiconfigurator (the tool runs in bench/aiconfigurator_serving.py,
in its own interpreter).

**The sample** (fixed; issue 14's figures were taken on it): the whole file's rows grouped by
``(system, backend, mode)`` (26 strata, sorted); each stratum gets ``N x size / total`` rows
rounded down, at least ``min(size, 10)``; the rows still missing to reach ``N`` go to the
strata with the largest fractional parts (one each, largest first); while the minimums
overshoot ``N``, the stratum furthest above its minimum gives one back. With
``rng = numpy.random.default_rng(0)``, stratum by stratum in sorted order, ``seed =
rng.integers(2**31)`` and the stratum's rows (file order) at positions
``numpy.random.RandomState(seed).choice(size, n, replace=False)`` are drawn. ``N = 800``
gives 800 rows, 458 of them evaluation rows: the scoreboard keeps those.
"""

from __future__ import annotations

import collections
import json
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from modperf.serving.silicon import EVALUATION, question

CHILD = Path(__file__).with_name("aiconfigurator_serving.py")
#: Interpreters tried, in order, when ``--tool-python`` is not given.
TOOL_PYTHONS = (sys.executable, "/work/main/.venv/bin/python", "/work/scratch/aic-venv/bin/python")
#: Bumped whenever the row -> tool mapping of the child changes (part of the cache key).
MAPPING = 1


# --- the sample ---------------------------------------------------------------------------------


def stratified_sample(rows: list[dict[str, Any]], n: int = 800, seed: int = 0) -> list[dict[str, Any]]:
    """The fixed stratified sample of the module docstring (rows of the whole file, both splits)."""
    strata: dict[tuple[str, str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows:
        strata[(str(r["system"]), str(r["backend"]), str(r["mode"]))].append(r)
    keys = sorted(strata)
    sizes = np.array([len(strata[k]) for k in keys])
    if n < np.minimum(sizes, 10).sum():
        raise SystemExit(f"--tool-sample {n}: below the strata's minimums ({np.minimum(sizes, 10).sum()} rows)")
    share = sizes / sizes.sum() * n
    take = np.maximum(np.minimum(sizes, 10), np.floor(share)).astype(int)
    short = n - int(take.sum())
    for i in np.argsort(-(share - np.floor(share)), kind="stable"):
        if short <= 0:
            break
        if take[i] < sizes[i]:
            take[i] += 1
            short -= 1
    while take.sum() > n:
        take[int(np.argmax(take - np.minimum(sizes, 10)))] -= 1
    rng = np.random.default_rng(seed)
    out = []
    for key, k in zip(keys, take):
        stratum_seed = int(rng.integers(1 << 31))
        positions = np.random.RandomState(stratum_seed).choice(len(strata[key]), size=int(k), replace=False)
        out += [strata[key][int(p)] for p in positions]
    return out


# --- the tool in child processes ----------------------------------------------------------------


def tool_version(python: str) -> tuple[str | None, str]:
    """(aiconfigurator's version, "") when ``python`` can import the tool's estimator, else (None, why)."""
    probe = ("import importlib.metadata as m, aiconfigurator.cli.api; print(m.version('aiconfigurator'))")
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if done.returncode:
        return None, (done.stderr.strip().splitlines() or ["exit " + str(done.returncode)])[-1]
    return done.stdout.strip(), ""


def find_tool_python(given: str | None) -> tuple[str | None, str | None, list[str]]:
    """(python, tool version, why each other candidate was passed over)."""
    tried = []
    for python in [given] if given else list(dict.fromkeys(TOOL_PYTHONS)):
        if not Path(python).exists():
            tried.append(f"{python}: no such file")
            continue
        version, why = tool_version(python)
        if version:
            return python, version, tried
        tried.append(f"{python}: {why}")
    return None, None, tried


class Worker:
    """One long-lived child process (the tool's databases load once per process)."""

    def __init__(self, python: str, aliases: dict[str, str], timeout_s: int, log: Path) -> None:
        self.args = [python, str(CHILD), "--timeout", str(timeout_s), "--aliases", json.dumps(aliases)]
        self.timeout_s = timeout_s
        self.log = log
        self._start()

    def _start(self) -> None:
        with open(self.log, "a") as err:
            self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         text=True, bufsize=1)
        hello = self._read(300) or {"ready": False, "error": f"the child wrote nothing (see {self.log})"}
        if not hello.get("ready"):
            self.close()
            raise RuntimeError(f"aiconfigurator child not ready: {hello.get('error')}")

    def _read(self, seconds: float) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], seconds)
        line = self.proc.stdout.readline() if ready else ""
        return json.loads(line) if line else None

    def ask(self, row: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(question(row)) + "\n")
        answer = self._read(self.timeout_s + 60)  # the child's own alarm fires first unless it is stuck
        if answer is None:  # stuck in native code or dead: start a fresh one for the next row
            self.close()
            self._start()
            return {"id": row["id"], "error": f"timeout: no answer in {self.timeout_s + 60} s (child restarted)"}
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def load_cache(path: Path, key: str) -> dict[str, dict[str, Any]]:
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by an interrupted run
            if entry.get("tool") == key:
                out[entry["id"]] = entry
    return out


def tool_answers(rows: list[dict[str, Any]], python: str, version: str, aliases: dict[str, str], jobs: int,
                 cache: Path, timeout_s: int) -> tuple[dict[str, dict[str, Any]], int, float]:
    """The tool's answer for every row: from the cache, the others asked by ``jobs`` children
    (appended to the cache as they come; timeouts are not cached). Returns (answers by id, rows
    asked now, seconds)."""
    key = f"aiconfigurator=={version}; mapping {MAPPING}"
    answers = load_cache(cache, key)
    todo = [r for r in rows if r["id"] not in answers]
    start = time.perf_counter()
    if not todo:
        return answers, 0, 0.0
    cache.parent.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    queue = list(reversed(todo))
    failures: list[str] = []
    log = cache.with_name(cache.name + ".stderr.log")

    def work() -> None:
        try:
            worker = Worker(python, aliases, timeout_s, log)
        except RuntimeError as exc:
            failures.append(str(exc))
            return
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    row = queue.pop()
                answer = {**worker.ask(row), "id": row["id"], "tool": key}
                with lock:
                    answers[row["id"]] = answer
                    if not str(answer.get("error", "")).startswith(("timeout", "RowTimeout")):
                        with open(cache, "a") as f:
                            f.write(json.dumps(answer) + "\n")
                    done = len(todo) - len(queue)
                    if done % 50 == 0:
                        print(f"  tool: {done}/{len(todo)} rows in {time.perf_counter() - start:.0f} s",
                              file=sys.stderr)
        finally:
            worker.close()

    threads = [threading.Thread(target=work) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures and queue:
        raise RuntimeError(failures[0])
    return answers, len(todo), time.perf_counter() - start


# --- the side-by-side table ---------------------------------------------------------------------


def stats(pairs: list[tuple[float | None, float]]) -> tuple[float, float, float]:
    """Median and p90 |relative error| and the median signed error of (predicted, measured)
    pairs; pairs without a prediction (a TTFT a deployment does not fix) are left out; NaN
    when none is left."""
    rel = np.array([p / m - 1 for p, m in pairs if p is not None])
    if rel.size == 0:
        return float("nan"), float("nan"), float("nan")
    return float(np.median(np.abs(rel))), float(np.percentile(np.abs(rel), 90)), float(np.median(rel))


def side_by_side(rows: list[dict[str, Any]], ours: dict[str, tuple[float | None, float]],
                 tool: dict[str, tuple[float, float]], tool_name: str) -> None:
    """Coverage of each, then on the rows both answered: median / p90 |relative error| and the
    median signed error of TTFT and TPOT, overall, by backend, by backend x mode."""
    groups: list[tuple[str, list[dict[str, Any]]]] = [("evaluation sample", rows)]
    for by in (lambda r: r["mode"], lambda r: r["backend"], lambda r: f"{r['backend']} {r['mode']}"):
        split = collections.defaultdict(list)
        for r in rows:
            split[by(r)].append(r)
        groups += [(k, split[k]) for k in sorted(split)]
    w = max(len(tool_name), len("modperf"))
    print(f"\n{'rows':<22} {'n':>4} {'modperf':>8} {'tool':>6} {'both':>5}  {'on both':<{w}} "
          f"{'TTFT med':>8} {'p90':>6} {'signed':>7}   {'TPOT med':>8} {'p90':>6} {'signed':>7}")
    for name, g in groups:
        both = [r for r in g if r["id"] in ours and r["id"] in tool and ours[r["id"]][0] is not None]
        head = (f"{name:<22} {len(g):>4} {sum(r['id'] in ours for r in g) / len(g):>8.0%} "
                f"{sum(r['id'] in tool for r in g) / len(g):>6.0%} {len(both):>5}  ")
        for i, (who, preds) in enumerate((("modperf", ours), (tool_name, tool))):
            line = (head if i == 0 else " " * len(head)) + f"{who:<{w}} "
            if both:
                t = stats([(preds[r["id"]][0], r["silicon_ttft_ms"]) for r in both])
                p = stats([(preds[r["id"]][1], r["silicon_tpot_ms"]) for r in both])
                line += f"{t[0]:>8.2f} {t[1]:>6.2f} {t[2]:>+7.2f}   {p[0]:>8.2f} {p[1]:>6.2f} {p[2]:>+7.2f}"
            print(line)


def own_rows(rows: list[dict[str, Any]], preds: dict[str, tuple[float | None, float]], who: str) -> None:
    """Each side on every row it answered (not only the shared ones)."""
    got = [r for r in rows if r["id"] in preds]
    if not got:
        print(f"{who}: no row answered")
        return
    t = stats([(preds[r["id"]][0], r["silicon_ttft_ms"]) for r in got])
    p = stats([(preds[r["id"]][1], r["silicon_tpot_ms"]) for r in got])
    print(f"{who:<24} on its own {len(got):>3} rows: TTFT {t[0]:.2f} / {t[1]:.2f} / {t[2]:+.2f}; "
          f"TPOT {p[0]:.2f} / {p[1]:.2f} / {p[2]:+.2f}")


def one_side_only(rows: list[dict[str, Any]], ours_reason: dict[str, str], tool_reason: dict[str, str],
                  ours: dict[str, Any], tool: dict[str, Any]) -> None:
    """Rows one side answers and the other does not, by the other side's reason."""
    for title, answered, other_reason in (("the tool answers, modperf does not", tool, ours_reason),
                                          ("modperf answers, the tool does not", ours, tool_reason)):
        only = [r for r in rows if r["id"] in answered and r["id"] in other_reason]
        print(f"\n{title}: {len(only)} rows")
        reasons = collections.Counter(f"{r['model_path']} {r['backend']} {r['mode']}: {other_reason[r['id']][:110]}"
                                      for r in only)
        for reason, n in reasons.most_common(12):
            print(f"  {n:>4}  {reason}")
    neither = collections.Counter(f"{r['mode']}: {tool_reason[r['id']][:60]}" for r in rows
                                  if r["id"] in ours_reason and r["id"] in tool_reason)
    print(f"\nneither answers: {sum(neither.values())} rows; most common (tool's reason):")
    for reason, n in neither.most_common(6):
        print(f"  {n:>4}  {reason}")


def evaluation_sample(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    return [r for r in stratified_sample(rows, n) if r["split"] == EVALUATION]


#: Where the tool's answers are kept between runs (keyed by row id, tool version and mapping).
DEFAULT_CACHE = Path("/tmp/modperf_tool_answers.jsonl")
