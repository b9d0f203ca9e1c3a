"""Load benchmark: modperf's strict load + keying, and ``modperf check`` over every table file the
corpus ships, against the cheapest plain pyarrow read of the same files.

Each measurement runs in a fresh child process (so peak RSS is its own), repeated; the table
shows medians and the modperf / plain ratio measured in this one run. The plain read is
measured twice, file after file and over a thread pool of as many workers as ``check`` uses;
the ratio is against the faster of the two (the cheapest read of the same files). The whole
corpus is also read the way ``bench/cold.py`` reads it (``ParquetFile`` with dictionary strings,
file by file). ``--database`` adds the resident memory a database holding every table adds, per
row stored (tables keyed from their files, and from a warm persisted cache).

With ``--before SRC`` every modperf measurement also runs on another source tree (its ``src``
folder), interleaved with this one (run k of every variant before run k+1 of any).

    python bench/load.py                       # h200_sxm sglang 0.5.14 + the whole corpus
    python bench/load.py --system b200_sxm --backend vllm --version 0.24.0 --repeat 5
    python bench/load.py --repeat 5 --database --before /work/main/src
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

#: The child imports modperf's modules by their flat paths (modperf.catalog, ...): a tree before
#: the stage packages has only those, and a tree after them resolves each to its home
#: (modperf.MOVED), so that the same child measures both.
CHILD = r"""
import json, os, resource, sys, time
mode, system, backend, version = sys.argv[1:5]
from modperf.catalog import Catalog
from modperf.families import declared_tables
cat = Catalog.scan()
refs = cat.select(system=None if system == "-" else system, backend=None if backend == "-" else backend,
                  version=None if version == "-" else version, tables=declared_tables())
start = time.perf_counter()
cpu_start = sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                   resource.getrusage(resource.RUSAGE_CHILDREN)))
rows, failed = 0, 0
if mode == "plain":
    import pyarrow.parquet as pq
    for r in refs:
        rows += pq.read_table(r.path).num_rows
elif mode == "plain-dict":
    import pyarrow.parquet as pq
    for r in refs:
        names = [f.name for f in pq.read_schema(r.path) if str(f.type) == "string"]
        rows += pq.ParquetFile(r.path, read_dictionary=names).read().num_rows
elif mode == "plain-pool":
    import pyarrow.parquet as pq
    from modperf.loader import parallel_map
    rows = sum(parallel_map(lambda r: pq.read_table(r.path).num_rows, refs))
elif mode == "load":
    from modperf.loader import load_one
    from modperf.models import ModelRegistry
    models = ModelRegistry.default()
    for r in refs:
        loaded = load_one(r, models)
        failed += not loaded.ok
        rows += loaded.keyed.rows_stored if loaded.keyed is not None else 0
elif mode == "check":
    from modperf.check import check
    report = check()
    rows, failed = report.rows, sum(not fr.ok for fr in report.files)
elif mode.startswith("database"):
    import modperf
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    db = modperf.open(cache=mode == "database-cache")
    before, kept = rss(), []
    for r in refs:
        try:
            kept.append(db.load(r))
        except modperf.ModperfError:
            failed += 1
            continue
        rows += kept[-1].rows_stored
    held = rss() - before
seconds = time.perf_counter() - start
usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
cpu = sum(u.ru_utime + u.ru_stime for u in usage) - cpu_start  # the process and its (reaped) workers
print(json.dumps({"files": len(refs), "rows": rows, "failed": failed, "seconds": seconds, "cpu": cpu,
                  "peak_rss_mb": max(resource.getrusage(who).ru_maxrss  # the process or its largest worker
                                     for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024,
                  **({"held_b_per_row": held / max(rows, 1)} if mode.startswith("database") else {})}))
"""


def run(mode: str, scope: tuple[str, str, str], src: str | None, cache_dir: str) -> dict:
    env = dict(os.environ, MODPERF_CACHE_DIR=cache_dir)
    if src is not None:
        env["PYTHONPATH"] = src
    out = subprocess.run([sys.executable, "-c", CHILD, mode, *scope], capture_output=True, text=True, check=True,
                         env=env).stdout
    return json.loads(out)


def summary(runs: list[dict]) -> dict:
    seconds = [r["seconds"] for r in runs]
    cpu = [r["cpu"] for r in runs]
    out = {"files": runs[0]["files"], "rows": runs[0]["rows"], "failed": runs[0]["failed"],
           "seconds": statistics.median(seconds), "spread": (min(seconds), max(seconds)),
           "cpu": statistics.median(cpu), "cpu_spread": (min(cpu), max(cpu)),
           "peak_rss_mb": max(r["peak_rss_mb"] for r in runs)}
    if "held_b_per_row" in runs[0]:
        out["held"] = statistics.median(r["held_b_per_row"] for r in runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="h200_sxm")
    ap.add_argument("--backend", default="sglang")
    ap.add_argument("--version", default="0.5.14")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--database", action="store_true", help="also the memory a database of every table holds")
    ap.add_argument("--before", help="another modperf source tree (its src folder) measured beside this one")
    args = ap.parse_args()
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    trees = [("", here)] + ([(" (before)", args.before)] if args.before else [])
    one = (args.system, args.backend, args.version)
    every = ("-", "-", "-")
    # (scope label, what, mode, scope, tree); plain reads run on this tree only (they use its catalog)
    variants = [("/".join(one), "plain read", "plain", one, here),
                ("/".join(one), "plain read, pool", "plain-pool", one, here)]
    variants += [("/".join(one), "modperf load+key" + label, "load", one, src) for label, src in trees]
    variants += [("whole corpus", "plain read", "plain", every, here),
                 ("whole corpus", "plain read, pool", "plain-pool", every, here),
                 ("whole corpus", "plain dict read", "plain-dict", every, here)]
    variants += [("whole corpus", "modperf check" + label, "check", every, src) for label, src in trees]
    if args.database:
        variants += [("whole corpus", f"database, {kind}" + label, f"database-{kind}", every, src)
                     for kind in ("nocache", "cache") for label, src in trees]
    with tempfile.TemporaryDirectory(prefix="modperf-load-bench-") as cache_root:
        caches = {src: os.path.join(cache_root, str(i)) for i, (_, src) in enumerate(trees)}
        if args.database:  # the cache rows read a warm cache: fill it first
            for _, src in trees:
                run("database-cache", every, src, caches[src])
        runs: dict[int, list[dict]] = {i: [] for i in range(len(variants))}
        for _ in range(args.repeat):
            for i, (_, _, mode, scope, src) in enumerate(variants):
                runs[i].append(run(mode, scope, src, caches.get(src, cache_root)))
    print(f"{'what':<30} {'scope':<24} {'files':>5} {'failed':>6} {'rows':>11} {'median s (min-max)':>20} "
          f"{'CPU s (min-max)':>20} {'peak RSS MiB':>13} {'ratio':>6} {'CPU ratio':>9}  held")
    for scope_label in dict.fromkeys(v[0] for v in variants):
        rows = [(v[1], summary(runs[i])) for i, v in enumerate(variants) if v[0] == scope_label]
        cheapest = min(r["seconds"] for what, r in rows if what.startswith("plain"))
        cheapest_cpu = min(r["cpu"] for what, r in rows if what.startswith("plain"))
        for what, r in rows:
            spread = f"{r['seconds']:.3f} ({r['spread'][0]:.2f}-{r['spread'][1]:.2f})"
            cpu = f"{r['cpu']:.3f} ({r['cpu_spread'][0]:.2f}-{r['cpu_spread'][1]:.2f})"
            held = f"{r['held']:.1f} B/row" if "held" in r else ""
            print(f"{what:<30} {scope_label:<24} {r['files']:>5} {r['failed']:>6} {r['rows']:>11,} {spread:>20} "
                  f"{cpu:>20} {r['peak_rss_mb']:>13.0f} {r['seconds'] / cheapest:>5.2f}x "
                  f"{r['cpu'] / cheapest_cpu:>8.2f}x  {held}")
    print("ratio = time / the cheapest plain pyarrow read of the same files (file by file, or a thread pool, or "
          "dictionary strings), measured in this run (goals: check <= 2x; a database <= 40 B per row). rows: as "
          "stored; a file that fails a guard counts none. CPU: user + system time of the process and its workers "
          "over the measured section (on a loaded machine the wall ratio drifts, the CPU ratio much less). peak "
          "RSS: the process's or its largest worker's. held: resident memory the database adds per row stored")


if __name__ == "__main__":
    main()
