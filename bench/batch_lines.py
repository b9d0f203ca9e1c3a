"""``query --batch`` per line, in process: the CPU time of reading a batch's lines and of
answering them chunk by chunk (``batch.run_chunks`` with ``query_lines.LineAnswerer``, answers
joined as the CLI joins them), without the process start and the output's writing that
``bench/cold.py``'s whole-process rates include.

    python bench/batch_lines.py [--lines 50000] [--runs 5] [--before /work/main/src]

Each tree runs in its own child interpreter (so ``--before`` measures another source tree);
the workloads are ``bench/cold.py``'s (mixed and sweep, the MLA module trtllm tables). A cell is
the least CPU time per line over ``--runs`` runs (a fresh answerer each), then, in brackets,
the median. A tree with ``batch.LineShapes`` reads and answers as the command does: lines of a
known shape by their pattern (learnt in each run's first chunk), the rest as JSON. Prints one
table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import cold  # noqa: E402

import modperf  # noqa: E402

CHILD = r"""
import io, json, statistics, sys, time
import modperf
from modperf.fast import batch
from modperf.fast.batch import read_lines, run_chunks
from modperf.query.lines import LineAnswerer

path, runs = sys.argv[1], int(sys.argv[2])
data = open(path, "rb").read()
lines = data.splitlines(keepends=True)
db = modperf.open()

def read():
    if hasattr(batch, "LineShapes"):  # (a tree reading lines of a known shape by their pattern)
        shapes = batch.LineShapes(LineAnswerer.free)
        for k in range(0, len(lines), batch.CHUNK_LINES):
            chunk = lines[k:k + batch.CHUNK_LINES]
            _, rest = shapes.split(chunk)
            batch._flat_objects([chunk[i] for i in rest])
    elif hasattr(batch, "_flat_objects"):
        for k in range(0, len(lines), batch.CHUNK_LINES):
            batch._flat_objects(lines[k:k + batch.CHUNK_LINES])
    else:
        [batch._flat_object(line) for line in lines]

def answer():
    answerer = LineAnswerer(db.queries)
    shaped = {}
    if hasattr(batch, "LineShapes"):  # (as the command runs it)
        shaped = dict(shapes=batch.LineShapes(answerer.free), answer_shaped=answerer.answer_shaped)
    for chunk in run_chunks(read_lines(io.BytesIO(data)), answerer.answer, **shaped):
        "".join([line + "\n" for _, line in chunk])

out = {}
for name, f in (("read", read), ("whole", answer)):
    f()
    times = []
    for _ in range(runs):
        t = time.process_time()
        f()
        times.append((time.process_time() - t) / len(lines) * 1e6)
    out[name] = (min(times), statistics.median(times))
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=50000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--before", help="another modperf source tree (its src folder) measured beside this one")
    args = parser.parse_args(argv)
    db = modperf.open(cache=False)
    label, backend, version, tables = cold.FAMILIES[0]
    pairs = []
    for table in tables:
        ref = db.ref(cold.SYSTEM, backend, version, table)
        pairs.append((ref, cold.question(db, ref)))
    trees = [("this tree", cold.SRC)] + ([("before", str(Path(args.before).resolve()))] if args.before else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="modperf-bench-batch-") as tmp:
        for workload in ("mixed", "sweep"):
            path = Path(tmp) / f"{workload}.jsonl"
            path.write_text(cold.batch_lines(db, [(label, pairs)], workload, args.lines))
            found = {}
            for name, src in trees:
                env = {**cold.env_for(src, tmp)}
                done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(args.runs)], env=env,
                                      capture_output=True, text=True, check=True)
                found[name] = json.loads(done.stdout.splitlines()[-1])
            for part in ("read", "whole"):
                cells = [f"{found[n][part][0]:.2f} ({found[n][part][1]:.2f})" for n, _ in trees]
                ratio = f"{found['before'][part][0] / found['this tree'][part][0]:.2f}x" if args.before else "-"
                rows.append((f"{workload}: {'reading the lines' if part == 'read' else 'read, answered, joined'}"
                             ", us per line", *cells, ratio))
    header = ("measure (CPU time, least (median))", *[n for n, _ in trees], "before / this tree")
    widths = [max(len(r[i]) for r in [*rows, header]) for i in range(len(header))]
    print(f"{args.lines:,} lines, {args.runs} runs per tree; before = {args.before or '-'}")
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
