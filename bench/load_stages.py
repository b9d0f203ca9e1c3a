"""Peak memory of each stage of loading one big table (read, validation, keying), in process.

The table is ``bench/bigtable.py``'s tiling of a corpus table. In a fresh child process per
tree, ``loader.load_one`` runs while a thread samples the process's RSS every 10 ms along with
the innermost modperf frame; each sample counts toward the stage it was taken in (the reader and
``validate.read_narrow``,
validation with the declared guards, keying with the point guards). Prints the peak per stage.

    python bench/load_stages.py --rows 5000000 --before /work/main/src
    python bench/load_stages.py --rows 20000000 --repeats 2    # every key twice: the duplicate rule

Prints one table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SRC = str(BENCH.parent / "src")
sys.path.insert(0, str(BENCH))
sys.path.insert(0, SRC)

from bigtable import SOURCE, tile  # noqa: E402

from modperf.fast.cache_keys import embedded_data_root  # noqa: E402

CHILD = r"""
import json, os, sys, threading, time
from pathlib import Path
import modperf
from modperf.data.loader import load_one
root, table = sys.argv[1], sys.argv[2]
db = modperf.open(data_root=root, cache=False)
ref = next(iter(db.queries.store.catalog.select(table=table, physical=True)))
page = os.sysconf("SC_PAGE_SIZE")
main = threading.get_ident()
peaks = {}
done = False

def stage_of(frame):
    names = []
    while frame is not None:
        names.append(Path(frame.f_code.co_filename).name if "modperf" in frame.f_code.co_filename else "")
        if frame.f_code.co_name == "read_narrow":  # validate's row-group read is the read
            names.append("reader.py")
        frame = frame.f_back
    for label, files in (("read", ("reader.py",)), ("validation", ("validate.py", "conventions.py")),
                         ("keying", ("buckets.py", "keyed_guards.py"))):
        if any(n in files for n in names):
            return label
    return "other"

def sample():
    while not done:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * page / 2**20
        label = stage_of(sys._current_frames().get(main))
        peaks[label] = max(peaks.get(label, 0.0), rss)
        time.sleep(0.01)

thread = threading.Thread(target=sample, daemon=True)
thread.start()
start = time.perf_counter()
loaded = load_one(ref, db.queries.store.models)
seconds = time.perf_counter() - start
done = True
thread.join()
print(json.dumps({"seconds": seconds, "points": loaded.keyed.n_points if loaded.keyed else None, **peaks}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--source", default=SOURCE, help="a table file of the embedded corpus, relative to it")
    parser.add_argument("--before", help="another modperf source tree (its src folder) measured beside this one")
    parser.add_argument("--repeats", type=int, default=1, help="times every key is measured (the duplicate rule)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="modperf-stages-"))
    try:
        path = work / "data" / args.source
        tile(embedded_data_root() / args.source, args.rows, path, args.repeats)
        table = Path(args.source).name.removesuffix("_perf.parquet")
        trees = [("this tree", SRC)] + ([("before", str(Path(args.before).resolve()))] if args.before else [])
        rows = []
        for run in range(args.runs):
            for name, src in trees:  # interleaved
                proc = subprocess.run([sys.executable, "-c", CHILD, str(work / "data"), table], capture_output=True,
                                      text=True, env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin",
                                                      "MODPERF_NO_CACHE": "1", "HOME": str(work)}, check=True)
                got = json.loads(proc.stdout)
                rows.append((name, run + 1, got))
        print(f"{args.rows:,} rows of {args.source}, every key measured {args.repeats}x; peak RSS MiB per stage of "
              "loader.load_one (sampled every 10 ms)")
        print("tree | run | seconds | read | validation | keying")
        for name, run, got in rows:
            print(f"{name} | {run} | {got['seconds']:.2f} | {got.get('read', 0):.0f} | "
                  f"{got.get('validation', 0):.0f} | "
                  f"{got.get('keying', 0):.0f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
