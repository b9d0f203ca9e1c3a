"""Load benchmark: modperf's strict load + keying, and ``modperf check`` over every table file the
corpus ships, against the cheapest plain pyarrow read of the same files.

Each measurement runs in a fresh child process (so peak RSS is its own), repeated; the table
shows medians and the modperf / plain ratio measured in this one run. The plain read is
measured twice, file after file and over a thread pool of as many workers as ``check`` uses;
the ratio is against the faster of the two (the cheapest read of the same files).

    python bench/load.py                       # h200_sxm sglang 0.5.14 + the whole corpus
    python bench/load.py --system b200_sxm --backend vllm --version 0.24.0 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, resource, sys, time
mode, system, backend, version = sys.argv[1:5]
from modperf.catalog import Catalog
from modperf.families import declared_tables
cat = Catalog.scan()
refs = cat.select(system=None if system == "-" else system, backend=None if backend == "-" else backend,
                  version=None if version == "-" else version, tables=declared_tables())
start = time.perf_counter()
rows, failed = 0, 0
if mode == "plain":
    import pyarrow.parquet as pq
    for r in refs:
        rows += pq.read_table(r.path).num_rows
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
seconds = time.perf_counter() - start
print(json.dumps({"files": len(refs), "rows": rows, "failed": failed, "seconds": seconds,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(mode: str, system: str, backend: str, version: str, repeat: int) -> dict:
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", CHILD, mode, system, backend, version],
                             capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out))
    return {"files": runs[0]["files"], "rows": runs[0]["rows"], "failed": runs[0]["failed"],
            "seconds": statistics.median(r["seconds"] for r in runs),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="h200_sxm")
    ap.add_argument("--backend", default="sglang")
    ap.add_argument("--version", default="0.5.14")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    one = (args.system, args.backend, args.version)
    every = ("-", "-", "-")
    groups = [
        ("/".join(one), [("plain read", measure("plain", *one, args.repeat)),
                         ("plain read, pool", measure("plain-pool", *one, args.repeat)),
                         ("modperf load+key", measure("load", *one, args.repeat))]),
        ("whole corpus", [("plain read", measure("plain", *every, args.repeat)),
                          ("plain read, pool", measure("plain-pool", *every, args.repeat)),
                          ("modperf check", measure("check", *every, args.repeat))]),
    ]
    print(f"{'what':<18} {'scope':<24} {'files':>5} {'failed':>6} {'rows':>11} {'median s':>9} {'peak RSS MiB':>13} "
          f"{'ratio':>6}")
    for scope, results in groups:
        cheapest = min(r["seconds"] for what, r in results if what.startswith("plain"))
        for what, r in results:
            print(f"{what:<18} {scope:<24} {r['files']:>5} {r['failed']:>6} {r['rows']:>11,} {r['seconds']:>9.3f} "
                  f"{r['peak_rss_mb']:>13.0f} {r['seconds'] / cheapest:>5.2f}x")
    print("ratio = time / the cheapest plain pyarrow read of the same files (file by file, or a thread pool), "
          "measured in this run (goals: load <= 2x, check <= 3x and < 10 s, peak < 1 GiB). rows: as stored; a "
          "file that fails a guard counts none")


if __name__ == "__main__":
    main()
