"""Cold start, memory and single-query speed, modperf beside the best tool (issue 10).

Every row of the issue's table, measured in one run, interleaved (run k of every variant before
run k+1 of any), ``--runs`` times; a cell is the median with the spread (min-max) of the runs.
Process rows time a fresh interpreter from spawn to exit and read its peak RSS from the kernel
(``wait4``); the cold and import rows give its CPU time (user + system) too, and each ratio both
ways (on a shared machine the wall time includes waiting for a core).
The tool (aiconfigurator-core, the wheel modperf reads its corpus from) runs only in
child processes: its cold rows through ``bench/aiconfigurator_child.py``, its warm query through
a small timing script given to a child interpreter; modperf never imports it.

Rows:

- cold process, one family's context + generation query (MLA module trtllm, GQA sglang, DSV4 CSA
  sglang, h200_sxm): modperf with its persisted cache warm (the cache of an earlier process that
  asked other points of the same groups: its keyed tables, grids and query plans),
  and with ``cache=False`` (every table keyed from its file, as a first-ever run), each tree
  (``--before``) both ways; beside them the cheapest read of the same files (a process importing
  ``pyarrow.parquet`` and reading them as ParquetFile with dictionary strings), the yardstick of
  a cold query's peak RSS;
- cold process, one query on each attention table of h200_sxm that the tool can be asked about
  (one slot per table);
- cold ``modperf query --batch FILE`` processes asking the same questions as the two rows
  above, one JSON line each (a one-family batch of 2 lines, and the 17-table batch: issue 10
  counted 14 attention tables when it set the goal; the bench's selection has found 17 on this
  corpus since its first version), their cache filled as for those rows;
- library import (``import modperf`` vs ``import aiconfigurator_core``, and the floor
  ``import numpy, pyarrow.parquet``);
- warm single query, on grid / off grid (median and p99 of per-query medians);
- ``query_many`` fixed cost (a one-point call, warm);
- whole-corpus ``check`` and the cheapest read of the same files (ParquetFile, dictionary strings);
- a database holding every table that loads: resident memory it adds, per row stored;
- ``query --batch`` lines per second (a file of mixed MLA context/generation lines);
- ``query --batch`` of refused lines, lines per second (``--refused-lines``, 100,000): physical
  contradictions (a head_dim, kv heads, native or local head count the model contradicts), and
  every kind of refusal (those, a key the table does not cover, an unknown field, a value that
  is not a number, a point no measurement reaches).

    python bench/cold.py [--runs 5] [--single 400] [--only-cold | --only-warm | --only-batch | --only-refused]
                         [--before OTHER/src] [--batch-lines 50000] [--batch-large 500000] [--refused-lines 100000]

Prints one table; asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from aiconfigurator_side import NotDrivable, point_query  # noqa: E402
from tests.helpers import point_fields  # noqa: E402

import modperf  # noqa: E402
from modperf.data.families import model_head_axis_tables  # noqa: E402

SYSTEM = "h200_sxm"
FAMILIES = [
    ("MLA module trtllm", "trtllm", "1.3.0rc20", ("mla_context_module", "mla_generation_module")),
    ("GQA sglang", "sglang", "0.5.14", ("context_attention", "generation_attention")),
    ("DSV4 CSA sglang", "sglang", "0.5.14", ("dsv4_csa_context_module", "dsv4_csa_generation_module")),
]
CHILD = BENCH / "aiconfigurator_child.py"
SRC = str(BENCH.parent / "src")
TIME = shutil.which("time") or "/usr/bin/time"  # GNU time: the child's peak RSS
#: Child processes compile modperf's modules once into a bytecode cache of their own (as an
#: installed package has; the tool's wheel ships its .pyc files too), not into the checkout.
#: A shell that sets PYTHONDONTWRITEBYTECODE would otherwise compile every module in every run.
PYCACHE = str(Path(tempfile.gettempdir()) / "modperf-bench-pycache")
_BASE_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPYCACHEPREFIX": PYCACHE}
ENV = {**_BASE_ENV, "PYTHONPATH": str(BENCH.parent / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}


# --- the questions ------------------------------------------------------------------------


def question(db: modperf.Database, ref: modperf.TableRef) -> tuple[dict[str, Any], list[Any]] | None:
    """One measured point of a table as (modperf's fields, the tool's query), or None when the
    tool cannot be asked about the table. The point is a measured one that modperf answers
    exactly (the first such of the first buckets)."""
    keyed = db.load(ref)
    for b in range(min(keyed.n_buckets, 50)):
        p = int(keyed.offsets[b])
        try:
            tool = point_query(keyed, db, b, p)
        except NotDrivable:
            return None
        except Exception:
            continue
        fields = point_fields(keyed, b, p)
        try:
            if db.answer(fields, quality=False).kind == "exact":
                return fields, tool
        except modperf.ModperfError:
            continue
    return None


# --- child processes ------------------------------------------------------------------------

MODPERF_CHILD = """
import json, sys
import modperf
try:
    db = modperf.open(cache=json.loads(sys.argv[2]))
except TypeError:  # a tree without the persisted cache
    db = modperf.open()
out = [db.answer(f, quality=False).latency_ms for f in json.loads(sys.argv[1])]
print(json.dumps(out))
"""


def spawn(cmd: list[str], stdin: str | None = None, env: dict[str, str] | None = None,
          ok: tuple[int, ...] = (0,)) -> tuple[float, float, str]:
    """(seconds, peak RSS MiB, stdout) of one child process. GNU time starts it and reports its
    peak RSS (a child forked from this process directly would count this process's pages)."""
    seconds, rss, _, out = spawn_cpu(cmd, stdin, env, ok)
    return seconds, rss, out


def spawn_cpu(cmd: list[str], stdin: str | None = None, env: dict[str, str] | None = None,
              ok: tuple[int, ...] = (0,)) -> tuple[float, float, float, str]:
    """:func:`spawn` with the child's CPU seconds (user + system, from GNU time) third: on a
    shared machine its wall time includes waiting for a core, its CPU time far less."""
    start = time.perf_counter()
    proc = subprocess.run([TIME, "-f", "MODPERF_RSS_KB %M %U %S", *cmd], input=stdin, capture_output=True,
                          text=True, env=env or ENV)
    seconds = time.perf_counter() - start
    if proc.returncode not in ok:
        raise RuntimeError(f"{' '.join(cmd[:3])} exited {proc.returncode}: {proc.stderr[-800:]}")
    last = [line for line in proc.stderr.splitlines() if line.startswith("MODPERF_RSS_KB ")][-1].split()
    return seconds, int(last[1]) / 1024.0, float(last[2]) + float(last[3]), proc.stdout


def env_for(src: str, cache_dir: str) -> dict[str, str]:
    return {**_BASE_ENV, "PYTHONPATH": src + os.pathsep + str(BENCH), "MODPERF_CACHE_DIR": cache_dir}


def modperf_cold(queries: list[dict[str, Any]], cache: bool, cache_dir: str,
                 src: str = SRC) -> tuple[float, float, float]:
    env = env_for(src, cache_dir)
    s, rss, cpu, out = spawn_cpu([sys.executable, "-c", MODPERF_CHILD, json.dumps(queries), json.dumps(cache)],
                                 env=env)
    assert len(json.loads(out)) == len(queries)
    return s, rss, cpu


def batch_cold(path: Path, n: int, cache_dir: str, src: str = SRC) -> tuple[float, float, float]:
    """A cold ``modperf query --batch FILE`` process (FILE: ``n`` questions, one JSON line each,
    every one answered)."""
    s, rss, cpu, out = spawn_cpu([sys.executable, "-m", "modperf", "query", "--batch", str(path)],
                                 env=env_for(src, cache_dir))
    lines = out.splitlines()
    assert len(lines) == n and not any(line.startswith('{"error"') for line in lines), out[:2000]
    return s, rss, cpu


def tool_cold(root: str, requests: list[dict[str, Any]]) -> tuple[float, float, float]:
    stdin = "".join(json.dumps({"root": root, **r}) + "\n" for r in requests)
    s, rss, cpu, out = spawn_cpu([sys.executable, str(CHILD)], stdin=stdin)
    lines = out.splitlines()
    assert json.loads(lines[0]).get("ready"), lines[0]
    for line in lines[1:]:
        reply = json.loads(line)
        assert all(v is not None for v in reply["latency"]), reply["error"]
    return s, rss, cpu


def tool_requests(pairs: list[tuple[modperf.TableRef, list[Any]]]) -> list[dict[str, Any]]:
    by_slot: dict[tuple[str, str, str], list[list[Any]]] = {}
    for ref, q in pairs:
        by_slot.setdefault((str(ref.system), str(ref.backend), str(ref.version)), []).append(q)
    return [{"system": s, "backend": b, "version": v, "queries": qs} for (s, b, v), qs in by_slot.items()]


TOOL_WARM = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import aiconfigurator_child as child
import aiconfigurator_core as core
req = json.loads(sys.argv[2])
engine = child._engine(core, req["system"], req["backend"], req["version"], req["root"])
out = []
for op, is_context, batch, s, prefix in req["queries"]:
    ops = json.dumps([op])
    engine.evaluate_ops_json(ops, bool(is_context), int(batch), int(s), int(prefix), 1.0, None)
    ts = []
    for _ in range(int(sys.argv[3])):
        t = time.perf_counter_ns()
        engine.evaluate_ops_json(ops, bool(is_context), int(batch), int(s), int(prefix), 1.0, None)
        ts.append(time.perf_counter_ns() - t)
    ts.sort()
    out.append([ts[len(ts) // 2] / 1000, ts[int(len(ts) * 0.99)] / 1000])
print(json.dumps(out))
"""


WARM_CHILD = """
import json, sys, time
import numpy as np
import modperf
db = modperf.open()
cases, n = json.loads(sys.argv[1]), int(sys.argv[2])
def timed(fields):
    db.answer(fields)
    ts = []
    for _ in range(n):
        t = time.perf_counter_ns()
        db.answer(fields)
        ts.append(time.perf_counter_ns() - t)
    ts.sort()
    return [ts[len(ts) // 2] / 1000, ts[int(len(ts) * 0.99)] / 1000]
on = [timed(f) for f, _ in cases]
off = [timed(m) for _, m in cases if m is not None]
fields = cases[0][0]
axes = [a for a in ("batch_size", "isl", "step") if a in fields]
scalar = {k: v for k, v in fields.items() if k not in axes}
arrays = {a: np.array([fields[a]]) for a in axes}
db.query_many(**scalar, **arrays)
ts = []
for _ in range(n):
    t = time.perf_counter_ns()
    db.query_many(**scalar, **arrays)
    ts.append(time.perf_counter_ns() - t)
ts.sort()
print(json.dumps({"on": on, "off": off, "many": ts[len(ts) // 2] / 1000}))
"""


#: The yardstick of a cold query's memory: the files it answers from read as cheaply as pyarrow
#: reads them (ParquetFile, strings as dictionaries), in a process that imports nothing else.
CHEAPEST_READ = """
import json, sys
import pyarrow.parquet as pq
for path in json.loads(sys.argv[1]):
    names = [f.name for f in pq.read_schema(path) if str(f.type) == "string"]
    pq.ParquetFile(path, read_dictionary=names).read()
"""


DATABASE_CHILD = """
import json, sys
import modperf
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
try:
    db = modperf.open(cache=json.loads(sys.argv[1]))
except TypeError:  # a tree without the persisted cache
    db = modperf.open()
before = rss()
kept, rows, points = [], 0, 0
for ref in db.catalog.select(physical=True):
    if modperf.family_of(ref.table) is None:
        continue
    try:
        keyed = db.load(ref)
    except modperf.ModperfError:
        continue
    kept.append(keyed)
    rows += keyed.rows_stored
    points += keyed.n_points
print(json.dumps({"tables": len(kept), "rows": rows, "points": points, "bytes": rss() - before}))
"""


# --- in-process measures ----------------------------------------------------------------------


def off_grid(db: modperf.Database, fields: dict[str, Any], heads: bool = True) -> dict[str, Any] | None:
    """The same question moved between measured values of its axes (interpolated); with
    ``heads=False`` the local head count stays (so the question stays in its plan)."""
    grid = db.queries.grid(fields)
    moved = dict(fields)
    for a, vals in zip(grid.axes, grid.values):
        if a in fields and vals.size > 1 and (heads or a != "num_heads"):
            i = int(np.searchsorted(vals, fields[a]))
            j = i + 1 if i + 1 < vals.size else i - 1
            moved[a] = int((int(vals[i]) + int(vals[j])) // 2)
    try:
        return moved if db.answer(moved, quality=False).kind == "interpolated" else None
    except modperf.ModperfError:
        return None


# --- the table --------------------------------------------------------------------------------


def cell(values: list[float], fmt: str = "{:.2f}") -> str:
    med = statistics.median(values)
    return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def batch_lines(db: modperf.Database, family_rows: list[Any], workload: str, n: int) -> str:
    """``n`` query lines of the first family's two tables. ``mixed``: its exact questions with
    batch and isl scaled by 1, 2 or 4 at random (a few distinct points: a third extrapolated
    or refused); ``sweep``: every axis drawn uniformly from the table's measured range (nearly
    every point distinct, mostly interpolated)."""
    rng = np.random.default_rng(0)
    _, pairs = family_rows[0]
    lines = []
    if workload == "mixed":
        fields = pairs[0][1][0]
        axes = [a for a in ("batch_size", "isl", "step") if a in fields]
        for k in range(n):
            base = dict(pairs[k % 2][1][0])
            for a in axes:
                if a in base and a != "step":
                    base[a] = int(base[a] * rng.choice([1, 2, 4]))
            lines.append(json.dumps(base))
    else:
        ranges = []
        for ref, _ in pairs:
            keyed = db.load(ref)
            ranges.append({a: (int(keyed.axes[a].min()), int(keyed.axes[a].max())) for a in keyed.spec.axes})
        for k in range(n):
            base = dict(pairs[k % 2][1][0])
            for a, (lo, hi) in ranges[k % 2].items():
                base[a] = int(rng.integers(lo, hi + 1))
            lines.append(json.dumps(base))
    return "\n".join(lines) + "\n"


def batch_rows(args: argparse.Namespace, db: modperf.Database, family_rows: list[Any], trees: list[tuple[str, str]],
               cache_dir: str) -> list[tuple[str, str, str, str, str]]:
    """``modperf query --batch`` lines per second, whole process, from a file and from stdin:
    every tree at ``--batch-lines`` and at ``--batch-large`` (ten times that unless given),
    and its rate past the start (the lines beyond the smaller batch over the extra time)."""
    rows = []
    small, large = args.batch_lines, args.batch_large or 10 * args.batch_lines
    for workload in ("mixed", "sweep"):
        text = {n: batch_lines(db, family_rows, workload, n) for n in (small, large)}
        path = {n: Path(cache_dir) / f"batch-{workload}-{n}.jsonl" for n in text}
        for n in text:
            path[n].write_text(text[n])
        seconds: dict[tuple[str, str, int], list[float]] = {}
        for _ in range(max(1, args.runs // 2)):
            for name, src in trees:
                for n in (small, large):
                    for source in ("file", "stdin"):
                        cmd = [sys.executable, "-m", "modperf", "query", "--batch", str(path[n]) if source == "file"
                               else "-"]  # (paths without spaces: tempfile's)
                        # the answers go to a file, as a user's would (through a pipe to this
                        # process, 0.9 KB a line, the reading here would be what is timed)
                        shell = " ".join(cmd) + (" < " + str(path[n]) if source == "stdin" else "") + " > " + \
                            str(Path(cache_dir) / "answers.jsonl")
                        s, _, _ = spawn(["sh", "-c", shell], env=env_for(src, cache_dir), ok=(0, 1))  # 1: refused
                        with open(Path(cache_dir) / "answers.jsonl", "rb") as answers:
                            assert sum(1 for _ in answers) == n
                        seconds.setdefault((name, source, n), []).append(s)

        def rate(name: str, source: str, n: int, seconds: dict = seconds) -> float:
            return n / statistics.median(seconds[(name, source, n)]) / 1000

        def past_start(name: str, source: str, seconds: dict = seconds) -> float:
            extra = statistics.median(seconds[(name, source, large)]) - \
                statistics.median(seconds[(name, source, small)])
            return (large - small) / extra / 1000

        def spread(name: str, source: str, n: int, seconds: dict = seconds) -> str:
            runs = seconds[(name, source, n)]
            return f"({n / max(runs) / 1000:.1f}-{n / min(runs) / 1000:.1f}k)"

        def rates(name: str, source: str) -> str:
            return f"{rate(name, source, small):.1f}k {spread(name, source, small)}; {large:,} lines: " \
                   f"{rate(name, source, large):.1f}k {spread(name, source, large)}; " \
                   f"past the start: {past_start(name, source):.1f}k"

        for source in ("file", "stdin"):
            mine = rates("modperf", source)
            before = rates("before", source) if args.before else "-"
            ratio = f"{rate('modperf', source, small) / rate('before', source, small):.2f}x / " \
                f"{rate('modperf', source, large) / rate('before', source, large):.2f}x / " \
                f"{past_start('modperf', source) / past_start('before', source):.2f}x before" if args.before else "-"
            rows.append((f"query --batch ({workload}, {source}), lines per second, whole process ({small:,} lines)",
                         "no batch mode", mine, before, ratio))
    return rows


#: Questions refused whatever their point: physical contradictions (what the model fixes given
#: otherwise), then the other kinds of refusal, each with the error kind its lines get.
_QWEN = {"system": SYSTEM, "backend": "sglang", "version": "0.5.14", "model": "Qwen/Qwen3-32B", "tp_size": 4}
_DSV3 = {"table": "mla_context_module", "system": SYSTEM, "backend": "trtllm", "version": "1.3.0rc20",
         "model": "deepseek-ai/DeepSeek-V3", "tp_size": 8}
CONTRADICTIONS = [
    ({"table": "context_attention", **_QWEN, "head_dim": 64}, "contradiction"),
    ({"table": "generation_attention", **_QWEN, "num_key_value_heads": 8}, "contradiction"),
    ({"table": "context_attention", **_QWEN, "num_heads": 8}, "shard"),
    ({**_DSV3, "native_heads": 64}, "query_field"),
]
OTHER_REFUSALS = [
    ({**_DSV3, "kv_cache_dtype": "int4"}, "not_covered"),  # a key the table does not cover
    ({**_DSV3, "colour": "red"}, "query_field"),  # an unknown field
    ({**_DSV3, "tp_size": "eight"}, "query_field"),  # a value that is not a number
    ({**_DSV3, "batch_size": "many"}, "query_field"),  # an axis value that is not a number
    (_DSV3, "out_of_coverage"),  # a point no measurement reaches (its axes drawn far past the grid)
]


def refused_lines(n: int, workload: str) -> tuple[str, dict[str, int]]:
    """``n`` refused lines (``contradictions``, or ``kinds``: every kind of refusal), their
    axes drawn at random, shuffled; and how many lines of each error kind."""
    rng = np.random.default_rng(2)
    questions = CONTRADICTIONS if workload == "contradictions" else CONTRADICTIONS + OTHER_REFUSALS
    picks = rng.integers(0, len(questions), n)
    batch, isl, step = rng.integers(1, 257, n), rng.integers(1, 8193, n), rng.integers(1, 8193, n)
    far = rng.integers(2 << 20, 4 << 20, n)
    lines, kinds = [], collections.Counter()
    for k in range(n):
        fields, kind = questions[picks[k]]
        point = {"batch_size": int(batch[k]), "isl": int(isl[k])}
        if fields["table"] == "generation_attention":
            point["step"] = int(step[k])
        if kind == "out_of_coverage":
            point = {"batch_size": int(far[k] >> 10), "isl": int(far[k])}
        lines.append(json.dumps({**point, **fields}))
        kinds[kind] += 1
    return "\n".join(lines) + "\n", dict(kinds)


def refused_rows(args: argparse.Namespace, trees: list[tuple[str, str]], cache_dir: str
                 ) -> list[tuple[str, str, str, str, str]]:
    """``modperf query --batch FILE`` of ``--refused-lines`` refused lines, lines per second,
    whole process: each tree ``--runs`` times (the tree before: at most 2, a slow path there)
    after an untimed run that fills the cache, answers written to a file and checked (every
    line an error of its kind)."""
    rows = []
    n = args.refused_lines
    for workload in ("contradictions", "kinds"):
        text, kinds = refused_lines(n, workload)
        path = Path(cache_dir) / f"refused-{workload}.jsonl"
        path.write_text(text)
        answers = Path(cache_dir) / "answers.jsonl"
        seconds: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        for run in range(-1, args.runs):  # (run -1: fills the cache, untimed)
            for name, src in trees:
                if name == "before" and run >= 2:
                    continue
                s, _, c, _ = spawn_cpu(["sh", "-c", f"{sys.executable} -m modperf query --batch {path} > {answers}"],
                                       env=env_for(src, cache_dir), ok=(1,))
                found = collections.Counter(json.loads(line)["error"]["kind"] for line in answers.open())
                assert found == kinds, (name, found, kinds)
                if run >= 0:
                    seconds.setdefault(name, []).append(s)
                    cpu.setdefault(name, []).append(c)

        def rate(name: str, seconds: dict[str, list[float]] = seconds, cpu: dict[str, list[float]] = cpu) -> str:
            runs, k = seconds[name], n / 1000
            return (f"{k / statistics.median(runs):.1f}k ({k / max(runs):.1f}-{k / min(runs):.1f}k)"
                    f"; by CPU time {k / statistics.median(cpu[name]):.1f}k")

        what = ", ".join(f"{v:,} {k}" for k, v in sorted(kinds.items()))
        rows.append((f"query --batch of {n:,} refused lines ({what}), lines per second, whole process",
                     "no batch mode", rate("modperf"), rate("before") if args.before else "-",
                     f"{statistics.median(seconds['before']) / statistics.median(seconds['modperf']):.1f}x before"
                     if args.before else "-"))
    return rows


def warm_rows(args: argparse.Namespace, family_rows: list[Any], trees: list[tuple[str, str]], cache_dir: str,
              root: str) -> list[tuple[str, str, str, str, str]]:
    """Warm single queries (on grid: the questions; off grid: each moved between measured
    values) and ``query_many``'s fixed cost: each tree in its own process, ``--runs`` times
    interleaved (a cell: the median over runs of the per-run figure, min-max); the tool in its
    own process, once per question."""
    here = modperf.open()
    cases, on_t = [], []
    for _, pairs in family_rows:
        for ref, (fields, tool_q) in pairs:
            cases.append([fields, off_grid(here, fields)])
            req = tool_requests([(ref, tool_q)])[0]
            _, _, out = spawn([sys.executable, "-c", TOOL_WARM, str(BENCH), json.dumps({"root": root, **req}),
                               str(args.single)])
            on_t.extend(json.loads(out))
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.runs):
        for name, src in trees:
            _, _, out = spawn([sys.executable, "-c", WARM_CHILD, json.dumps(cases), str(args.single)],
                              env=env_for(src, cache_dir))
            runs.setdefault(name, []).append(json.loads(out))

    def med(xs: list[list[float]], i: int) -> float:
        return statistics.median(x[i] for x in xs)

    def figure(name: str, part: str, i: int) -> list[float]:  # per run: the median over questions
        return [med(w[part], i) if part != "many" else w["many"] for w in runs[name]]

    def single(name: str) -> str:
        return (f"{cell(figure(name, 'on', 0), '{:.1f}')} (p99 {cell(figure(name, 'on', 1), '{:.1f}')}) / "
                f"{cell(figure(name, 'off', 0), '{:.1f}')} (p99 {cell(figure(name, 'off', 1), '{:.1f}')}) us")

    def ratio(name: str, part: str) -> float:
        return statistics.median(figure(name, part, 0)) / statistics.median(figure("before", part, 0))

    tool = med(on_t, 0)
    rows = [(f"warm single query, median (p99): on grid / off grid ({len(cases)} tables)",
             f"{tool:.1f} ({med(on_t, 1):.1f}) us on grid", single("modperf"),
             single("before") if args.before else "-",
             f"{statistics.median(figure('modperf', 'on', 0)) / tool:.2f} on grid"
             + (f"; before {statistics.median(figure('before', 'on', 0)) / tool:.2f}; after/before: on "
                f"{ratio('modperf', 'on'):.2f}, off {ratio('modperf', 'off'):.2f}" if args.before else "")),
            ("query_many fixed cost per call (one point, warm)", "-",
             f"{cell(figure('modperf', 'many', 0), '{:.1f}')} us",
             f"{cell(figure('before', 'many', 0), '{:.1f}')} us" if args.before else "-",
             f"{ratio('modperf', 'many'):.2f} of before" if args.before else "-")]
    return rows


def print_table(rows: list[Any], args: argparse.Namespace, skipped: list[str], cache_dir: str) -> int:
    shutil.rmtree(cache_dir, ignore_errors=True)
    header = ("measure", "aiconfigurator-core 0.12.0", "modperf", "modperf before (--before)", "ratio (modperf / tool)")
    widths = [max(len(r[i]) for r in [*rows, header]) for i in range(len(header))]
    print(f"runs: {args.runs} interleaved; median (min-max); peak RSS by GNU time; before = {args.before or '-'}; "
          f"attention tables with no tool op (left out): {', '.join(skipped) or '-'}")
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(v.ljust(w) for v, w in zip(row, widths)))
    return 0



def check_rows(args: argparse.Namespace, trees: list[tuple[str, str]], cache_dir: str) -> list[tuple[str, ...]]:
    """The whole-corpus ``check`` beside the cheapest read of the same files (a process reading
    every file with ``ParquetFile`` and dictionary strings), interleaved; CPU time (user +
    system, workers included) beside the wall time."""
    # (the flat path modperf.catalog: both a tree before the stage packages and one after have it)
    read = ("import sys, pyarrow.parquet as pq\nfrom modperf.catalog import Catalog\n"
            "for r in Catalog.scan().files:\n"
            "    if r.path.suffix == '.parquet':\n"
            "        names = [f.name for f in pq.read_schema(r.path) if str(f.type) == 'string']\n"
            "        pq.ParquetFile(r.path, read_dictionary=names).read()\n")
    checks: dict[str, list[tuple[float, float, float, str]]] = {}
    reads = []
    for _ in range(args.runs if args.only_check else 2):
        reads.append(spawn_cpu([sys.executable, "-c", read]))
        for name, src in trees:
            checks.setdefault(name, []).append(spawn_cpu([sys.executable, "-m", "modperf", "check", "--json"],
                                                         env=env_for(src, cache_dir), ok=(0, 1)))
    r = statistics.median(x[0] for x in reads)
    r_cpu = statistics.median(x[2] for x in reads)

    def chk(name: str) -> str:
        c = statistics.median(x[0] for x in checks[name])
        cpu = statistics.median(x[2] for x in checks[name])
        return (f"{c:.2f} s ({min(x[0] for x in checks[name]):.2f}-{max(x[0] for x in checks[name]):.2f}), "
                f"{max(x[1] for x in checks[name]):.0f} MiB ({c / r:.2f}x the read); CPU {cpu:.2f} s "
                f"({cpu / r_cpu:.2f}x the read's)")

    return [(f"whole-corpus check (cheapest read of the same files: {r:.2f} s "
             f"({min(x[0] for x in reads):.2f}-{max(x[0] for x in reads):.2f}), CPU {r_cpu:.2f} s, "
             f"{max(x[1] for x in reads):.0f} MiB)", "-", chk("modperf"), chk("before") if len(trees) > 1 else "-",
             "-")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="interleaved runs of every process row")
    parser.add_argument("--single", type=int, default=2000, help="timed repetitions of one warm query")
    parser.add_argument("--batch-lines", type=int, default=50000, help="lines of the smaller query --batch")
    parser.add_argument("--batch-large", type=int, help="lines of the larger query --batch (default: 10x the smaller)")
    parser.add_argument("--refused-lines", type=int, default=100_000, help="lines of the refused query --batch")
    parser.add_argument("--skip-check", action="store_true", help="leave out the whole-corpus check row")
    parser.add_argument("--skip-database", action="store_true", help="leave out the all-tables database row")
    parser.add_argument("--only-batch", action="store_true", help="only the query --batch rows")
    parser.add_argument("--only-refused", action="store_true", help="only the refused query --batch rows")
    parser.add_argument("--only-warm", action="store_true", help="only the warm single query and query_many rows")
    parser.add_argument("--only-cold", action="store_true",
                        help="only the cold process and import rows (and the cheapest read of their files)")
    parser.add_argument("--only-check", action="store_true",
                        help="only the whole-corpus check row (--runs interleaved runs, CPU time beside)")
    parser.add_argument("--before", help="another modperf source tree (its src folder) measured beside this one")
    args = parser.parse_args(argv)

    from modperf.fast.cache_keys import embedded_systems_dir

    root = str(embedded_systems_dir())
    db = modperf.open(cache=False)
    cache_dir = tempfile.mkdtemp(prefix="modperf-bench-cache-")

    # the questions
    family_rows = []
    for label, backend, version, tables in FAMILIES:
        pairs = []
        for table in tables:
            ref = db.ref(SYSTEM, backend, version, table)
            found = question(db, ref)
            if found is None:
                raise SystemExit(f"no exact point the tool can be asked about in {ref.label}")
            pairs.append((ref, found))
        family_rows.append((label, pairs))
    trees = [("modperf", SRC)] + ([("before", str(Path(args.before).resolve()))] if args.before else [])
    if args.only_warm:
        return print_table(warm_rows(args, family_rows, trees, cache_dir, root), args, [], cache_dir)
    if args.only_check:
        return print_table(check_rows(args, trees, cache_dir), args, [], cache_dir)
    if args.only_refused:
        return print_table(refused_rows(args, trees, cache_dir), args, [], cache_dir)
    heads_tables = set(model_head_axis_tables())
    every: dict[str, tuple[modperf.TableRef, tuple[dict[str, Any], list[Any]]]] = {}
    skipped = []
    for ref in sorted(db.catalog.select(system=SYSTEM, physical=False),
                      key=lambda r: (r.table, r.backend != "sglang", r.backend, r.version)):
        if ref.table in heads_tables and ref.table not in every and ref.table not in skipped:
            found = question(db, ref)
            if found is None:
                skipped.append(ref.table)
            else:
                every[ref.table] = (ref, found)

    # process rows, interleaved
    variants: dict[str, list[tuple[float, float, float]]] = {}

    def add(name: str, result: tuple[float, float, float]) -> None:
        variants.setdefault(name, []).append(result)

    # fill the cache once per tree (what an earlier process leaves behind); the earlier process
    # asks other points of the same groups (between measured values, where the grid has them), so
    # that the timed processes ask points no process asked before (persisted plans hold grids,
    # not answers)
    def earlier(pairs: list[Any]) -> list[dict[str, Any]]:
        return [off_grid(db, f, heads=False) or f for _, (f, _) in pairs]

    def fill(questions: list[dict[str, Any]], src: str) -> None:
        """The library process (quality notes off, as the timed ones ask) and a ``query --batch``
        (the command line lists quality notes: a plan it reads must know its group's notes)."""
        modperf_cold(questions, True, cache_dir, src)
        path = Path(cache_dir) / "fill.jsonl"
        path.write_text("".join(json.dumps(q) + "\n" for q in questions))
        spawn([sys.executable, "-m", "modperf", "query", "--batch", str(path)], env=env_for(src, cache_dir), ok=(0, 1))

    filled_other = 0
    for _, src in trees:
        for _, pairs in family_rows:
            asked_before = earlier(pairs)
            filled_other += sum(a != f for a, (_, (f, _)) in zip(asked_before, pairs))
            fill(asked_before, src)
    if args.only_batch:
        return print_table(batch_rows(args, db, family_rows, trees, cache_dir), args, skipped, cache_dir)
    for _, src in trees:
        asked_before = earlier(list(every.values()))
        filled_other += sum(a != f for a, (_, (f, _)) in zip(asked_before, every.values()))
        fill(asked_before, src)
    print(f"the cache was filled asking other points than the timed processes for {filled_other} of "
          f"{len(trees) * (sum(len(p) for _, p in family_rows) + len(every))} questions", file=sys.stderr)
    batch_files = {}
    for k, (label, pairs) in enumerate([*family_rows, ("all", list(every.values()))]):
        batch_files[label] = Path(cache_dir) / f"cold-batch-{k}.jsonl"
        batch_files[label].write_text("".join(json.dumps(f) + "\n" for _, (f, _) in pairs))
    for _ in range(args.runs):
        for label, pairs in [*family_rows, ("all", list(every.values()))]:
            queries = [f for _, (f, _) in pairs]
            add(f"{label}/tool", tool_cold(root, tool_requests([(r, q) for r, (_, q) in pairs])))
            add(f"{label}/modperf", modperf_cold(queries, True, cache_dir))
            add(f"{label}/batch", batch_cold(batch_files[label], len(pairs), cache_dir))
            if args.before:
                add(f"{label}/batch-before", batch_cold(batch_files[label], len(pairs), cache_dir, trees[1][1]))
            add(f"{label}/modperf-nocache", modperf_cold(queries, False, cache_dir))
            add(f"{label}/read", spawn_cpu([sys.executable, "-c", CHEAPEST_READ,
                                            json.dumps(sorted({str(r.path) for r, _ in pairs}))])[:3])
            if args.before:
                add(f"{label}/before", modperf_cold(queries, True, cache_dir, trees[1][1]))
                add(f"{label}/before-nocache", modperf_cold(queries, False, cache_dir, trees[1][1]))
        add("import/floor", spawn_cpu([sys.executable, "-c", "import numpy, pyarrow.parquet"])[:3])
        # the floor of a process answering from the cache (it imports numpy, not pyarrow)
        add("import/numpy", spawn_cpu([sys.executable, "-c", "import numpy"])[:3])
        add("import/tool", spawn_cpu([sys.executable, "-c", "import aiconfigurator_core"])[:3])
        for name, src in trees:
            add(f"import/{name}", spawn_cpu([sys.executable, "-c", "import modperf"],
                                            env=env_for(src, cache_dir))[:3])

    rows: list[tuple[str, ...]] = []

    def secs(name: str) -> list[float]:
        return [v[0] for v in variants[name]]

    def mib(name: str) -> list[float]:
        return [v[1] for v in variants[name]]

    def cpus(name: str) -> list[float]:
        return [v[2] for v in variants[name]]

    def proc(name: str) -> str:
        return f"{cell(secs(name))} s (cpu {cell(cpus(name))} s), {cell(mib(name), '{:.0f}')} MiB"

    def ratio(a: str, b: str) -> str:
        """Wall-time ratio of the medians, then the CPU-time ratio in brackets."""
        cpu_b = statistics.median(cpus(b))  # GNU time counts in 10 ms steps: a tiny child may show 0
        cpu = f"{statistics.median(cpus(a)) / cpu_b:.2f}" if cpu_b else "-"
        return f"{statistics.median(secs(a)) / statistics.median(secs(b)):.2f} [cpu {cpu}]"

    for label, _pairs in [*family_rows, ("all", list(every.values()))]:
        title = (f"cold process, {label} context + generation" if label != "all" else
                 f"cold process, one query on each of {len(every)} attention tables of {SYSTEM} ({len(every)}/"
                 f"{len(every)} answered)")
        read_rss = statistics.median(mib(f"{label}/read"))
        rows.append((title, proc(f"{label}/tool"),
                     f"cache: {proc(label + '/modperf')}; no cache: {proc(label + '/modperf-nocache')}",
                     f"cache: {proc(label + '/before')}; no cache: {proc(label + '/before-nocache')}"
                     if args.before else "-",
                     f"{ratio(label + '/modperf', label + '/tool')} (no cache "
                     f"{ratio(label + '/modperf-nocache', label + '/tool')})"
                     + (f"; before {ratio(label + '/before', label + '/tool')} (no cache "
                        f"{ratio(label + '/before-nocache', label + '/tool')})" if args.before else "")
                     + f"; floor (a process importing numpy alone, {proc('import/numpy')}) / tool: "
                     f"{ratio('import/numpy', label + '/tool')}"
                     + f"; peak RSS, cache / the cheapest read of its files ({proc(label + '/read')}): "
                     f"{statistics.median(mib(label + '/modperf')) / read_rss:.2f}"
                     + (f" (before {statistics.median(mib(label + '/before')) / read_rss:.2f})"
                        if args.before else "")))
    for label, pairs in [*family_rows, ("all", list(every.values()))]:
        title = (f"cold `query --batch`, {label} context + generation ({len(pairs)} lines)" if label != "all" else
                 f"cold `query --batch`, one line on each of {len(every)} attention tables of {SYSTEM} "
                 f"({len(every)}/{len(every)} answered)")
        rows.append((title, proc(f"{label}/tool"), proc(f"{label}/batch"),
                     proc(f"{label}/batch-before") if args.before else "-",
                     f"{ratio(label + '/batch', label + '/tool')}"
                     + (f"; before {ratio(label + '/batch-before', label + '/tool')}" if args.before else "")
                     + f"; the library process above / this: {ratio(label + '/modperf', label + '/batch')}"))
    rows.append(("library import (floor: import numpy, pyarrow.parquet " + proc("import/floor") + ")",
                 proc("import/tool"), proc("import/modperf"), proc("import/before") if args.before else "-",
                 f"{ratio('import/modperf', 'import/tool')}; vs floor {ratio('import/modperf', 'import/floor')}"
                 + (f" (before {ratio('import/before', 'import/floor')})" if args.before else "")))

    if args.only_cold:
        return print_table(rows, args, skipped, cache_dir)

    rows.extend(warm_rows(args, family_rows, trees, cache_dir, root))

    # query --batch lines per second
    rows += batch_rows(args, db, family_rows, trees, cache_dir)
    rows += refused_rows(args, trees, cache_dir)

    if not args.skip_check:
        rows += check_rows(args, trees, cache_dir)

    if not args.skip_database:
        def database(src: str, cache: bool) -> str:
            _, peak, out = spawn([sys.executable, "-c", DATABASE_CHILD, json.dumps(cache)], env=env_for(src, cache_dir))
            d = json.loads(out)
            return (f"{d['bytes'] / 2**20:.0f} MiB held for {d['tables']} tables, {d['bytes'] / d['rows']:.1f} B/row "
                    f"({d['bytes'] / d['points']:.1f} B/point; peak {peak:.0f} MiB)")

        database(SRC, True)  # fills the cache
        rows.append(("a database holding every table that loads (RSS growth / rows stored)", "-",
                     f"cache: {database(SRC, True)}; no cache: {database(SRC, False)}",
                     database(trees[1][1], False) if args.before else "-", "-"))

    return print_table(rows, args, skipped, cache_dir)

if __name__ == "__main__":
    sys.exit(main())
