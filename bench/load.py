"""Load benchmark: modperf's strict load + keying against a plain pyarrow read of the same files.

Each measurement runs in a fresh child process (so peak RSS is its own), repeated; the table
shows medians and the modperf / plain ratio measured in this one run.

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
import json, resource, sys, time
mode, system, backend, version = sys.argv[1:5]
from modperf.catalog import Catalog
from modperf.families import head_bearing_tables
cat = Catalog.scan()
refs = cat.select(system=None if system == "-" else system, backend=None if backend == "-" else backend,
                  version=None if version == "-" else version, tables=head_bearing_tables())
start = time.perf_counter()
rows = 0
if mode == "plain":
    import pyarrow.parquet as pq
    for r in refs:
        rows += pq.read_table(r.path).num_rows
elif mode == "load":
    from modperf.loader import load_table
    from modperf.models import ModelRegistry
    models = ModelRegistry.default()
    for r in refs:
        rows += load_table(r, models).rows_read
elif mode == "check":
    from modperf.check import check
    report = check()
    assert report.ok
    rows = report.rows
seconds = time.perf_counter() - start
print(json.dumps({"files": len(refs), "rows": rows, "seconds": seconds,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(mode: str, system: str, backend: str, version: str, repeat: int) -> dict:
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", CHILD, mode, system, backend, version],
                             capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out))
    return {"files": runs[0]["files"], "rows": runs[0]["rows"],
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
    results = [
        ("plain read", "/".join(one), measure("plain", *one, args.repeat)),
        ("modperf load+key", "/".join(one), measure("load", *one, args.repeat)),
        ("plain read", "whole corpus", measure("plain", "-", "-", "-", args.repeat)),
        ("modperf check", "whole corpus", measure("check", "-", "-", "-", args.repeat)),
    ]
    print(f"{'what':<18} {'scope':<24} {'files':>5} {'rows':>10} {'median s':>9} {'peak RSS MiB':>13} {'ratio':>6}")
    for i, (what, scope, r) in enumerate(results):
        base = results[i - 1][2] if i % 2 else r
        ratio = r["seconds"] / base["seconds"]
        print(f"{what:<18} {scope:<24} {r['files']:>5} {r['rows']:>10,} {r['seconds']:>9.3f} "
              f"{r['peak_rss_mb']:>13.0f} {ratio:>5.2f}x")
    print("ratio = modperf time / plain pyarrow read time of the same files, measured in this run "
          "(goals: load <= 2x, check <= 3x and < 10 s, peak < 1 GiB)")


if __name__ == "__main__":
    main()
