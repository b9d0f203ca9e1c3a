"""Memory and time of one big table: ``modperf check`` and one query on a synthetic 20M-row
table, against the cheapest read of the same file and its decoded Arrow size.

The table is a real corpus table tiled: tile ``k`` is every row of the source with
``batch_size`` shifted by ``k`` times the source's largest batch (so that no two rows share a
key) and ``latency`` raised by ``k`` times its largest (so that latency still grows with batch
across tiles: the quality notes a query lists find in the big table what they find in the
source, not one step per tile boundary), written under a temporary data root in the standard layout
(``{system}/{family}/{backend}/{version}/{table}_perf.parquet``, zstd like the corpus). Every
measurement is a fresh child process under GNU time (peak RSS); the query is asked without
the cache (keyed from the file, what the first query of a new table costs), then twice with
it (the first fills it, the second answers from it).

    python bench/bigtable.py                      # 20M rows of h200_sxm dsa_context_module
    python bench/bigtable.py --rows 5000000 --runs 3 --before /work/main/src
    python bench/bigtable.py --repeats 2          # every key measured twice (the duplicate rule merges them)

Prints one table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

BENCH = Path(__file__).resolve().parent
SRC = str(BENCH.parent / "src")
sys.path.insert(0, SRC)

import modperf  # noqa: E402
from modperf.data.buckets import NATIVE  # noqa: E402
from modperf.data.families.base import HEADS, TP, Tier  # noqa: E402
from modperf.fast.cache_keys import embedded_data_root  # noqa: E402

SOURCE = "h200_sxm/sparse_attention/sglang/0.5.14/dsa_context_module_perf.parquet"
TIME = shutil.which("time") or "/usr/bin/time"
PYCACHE = str(Path(tempfile.gettempdir()) / "modperf-bench-pycache")

READ_CHILD = r"""
import json, sys, time
import pyarrow.parquet as pq
start = time.perf_counter()
path = sys.argv[1]
names = [f.name for f in pq.read_schema(path) if str(f.type) in ("string", "large_string")]
table = pq.ParquetFile(path, read_dictionary=names).read()
print(json.dumps({"seconds": time.perf_counter() - start, "rows": table.num_rows, "nbytes": table.nbytes}))
"""


def tile(source: Path, rows: int, out: Path, repeats: int = 1) -> int:
    """The source table tiled to ``rows`` rows (batch_size shifted per tile), written to ``out``;
    returns the number of tiles. With ``repeats`` > 1 every run of that many tiles shares its
    shift, so that every key is measured that many times (the latencies differ slightly: the
    duplicate rule merges them)."""
    table = pq.read_table(source)
    step = int(pc.max(table["batch_size"]).as_py())
    at = table.schema.get_field_index("batch_size")
    lat_at = table.schema.get_field_index("latency")
    rise = float(pc.max(table["latency"]).as_py())
    tiles = -(-rows // table.num_rows)
    meta = pq.ParquetFile(source).metadata
    compression = meta.row_group(0).column(0).compression.lower()
    out.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(out, table.schema, compression=compression) as writer:
        left = rows
        for k in range(tiles):
            shift, again = divmod(k, repeats)
            part = table.set_column(at, "batch_size",
                                    pc.add(table["batch_size"], pa.scalar(shift * step, pa.int64())))
            # latency rises by the table's largest per tile: every series stays as monotone as
            # the source's (the quality checks find what they find in the source, per tile)
            part = part.set_column(lat_at, "latency", pc.add(table["latency"], pa.scalar(shift * rise + again * 1e-3)))
            part = part.slice(0, min(left, part.num_rows))
            writer.write_table(part, row_group_size=1 << 20)
            left -= part.num_rows
    return tiles


def query_fields(db: modperf.Database, rel: str) -> dict[str, object]:
    """A measured point of the source table (tile 0 of the big one holds it unchanged)."""
    system, _, backend, version, name = rel.split("/")
    keyed = db.table(system, backend, version, name.removesuffix("_perf.parquet"))
    b, p = 0, int(keyed.offsets[0])
    key = dict(zip(keyed.key_names, keyed.bucket_keys[b]))
    fields: dict[str, object] = {k: v for k, v in key.items() if k not in (NATIVE, "local_num_heads", HEADS, TP)}
    fields.update({a: int(keyed.axes[a][p]) for a in keyed.spec.axes})
    if keyed.family.tier is Tier.NATIVE:
        fields.update(native_heads=int(key[HEADS]), tp_size=int(key[TP]))
    elif keyed.family.tier is Tier.NATIVE_LOCAL:
        fields.update(native_heads=int(key[NATIVE]), num_heads=int(keyed.bucket_local[b]))
    elif keyed.spec.head_axis:
        fields["num_heads"] = int(keyed.bucket_local[b])
    return {"system": system, "backend": backend, "version": version, **fields}


def env_for(src: str, work: Path) -> dict[str, str]:
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
           "PYTHONPATH": src, "PYTHONPYCACHEPREFIX": PYCACHE, "MODPERF_CACHE_DIR": str(work / "cache")}
    env.pop("MODPERF_NO_CACHE", None)
    return env


def spawn(cmd: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> tuple[float, float, str]:
    """(seconds, peak RSS MiB, stdout) of one child process under GNU time."""
    start = time.perf_counter()
    proc = subprocess.run([TIME, "-f", "MODPERF_RSS_KB %M", *cmd], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode not in ok:
        raise RuntimeError(f"{' '.join(cmd[:4])} exited {proc.returncode}: {proc.stderr[-1500:]}")
    rss = [line for line in proc.stderr.splitlines() if line.startswith("MODPERF_RSS_KB ")]
    return seconds, int(rss[-1].split()[1]) / 1024.0, proc.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--runs", type=int, default=1, help="runs of every measurement (median, min-max)")
    parser.add_argument("--source", default=SOURCE, help="a table file of the embedded corpus, relative to it")
    parser.add_argument("--before", help="another modperf source tree (its src folder) measured beside this one")
    parser.add_argument("--repeats", type=int, default=1, help="times every key is measured (the duplicate rule)")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="modperf-bigtable-"))
    try:
        root = work / "data"
        path = root / args.source
        start = time.perf_counter()
        tiles = tile(embedded_data_root() / args.source, args.rows, path, args.repeats)
        built = time.perf_counter() - start
        fields = query_fields(modperf.open(cache=False), args.source)
        table = Path(args.source).name.removesuffix("_perf.parquet")
        trees = [("", SRC)] + ([("before: ", str(Path(args.before).resolve()))] if args.before else [])
        query = ["query", table, "--data-root", str(root), "--json"]
        for k, v in fields.items():
            query += [f"--{k.replace('_', '-')}", str(v)]
        results: dict[str, list[tuple[float, float]]] = {}
        nbytes = 0
        answers = set()
        for _ in range(args.runs):
            s, rss, out = spawn([sys.executable, "-c", READ_CHILD, str(path)], env_for(SRC, work))
            nbytes = json.loads(out)["nbytes"]
            results.setdefault("cheapest read (ParquetFile, dictionary strings)", []).append((s, rss))
            for name, src in trees:  # interleaved
                env = env_for(src, work)
                modperf_cmd = [sys.executable, "-m", "modperf"]
                s, rss, _ = spawn([*modperf_cmd, "check", "--data-root", str(root), "--json"], env, ok=(0, 1))
                results.setdefault(f"{name}modperf check", []).append((s, rss))
                s, rss, out = spawn([*modperf_cmd, "--no-cache", *query], env)
                answers.add(json.loads(out)["latency_ms"])
                results.setdefault(f"{name}one query, no cache", []).append((s, rss))
                shutil.rmtree(work / "cache", ignore_errors=True)
                for label in ("one query, filling the cache", "one query, from the cache"):
                    s, rss, out = spawn([*modperf_cmd, *query], env)
                    answers.add(json.loads(out)["latency_ms"])
                    results.setdefault(f"{name}{label}", []).append((s, rss))
                shutil.rmtree(work / "cache", ignore_errors=True)
        size = path.stat().st_size
        print(f"{args.rows:,} rows: {args.source} tiled {tiles}x (built in {built:.1f} s), {size / 2**20:.0f} MiB "
              f"parquet; decoded Arrow size {nbytes / 2**20:.0f} MiB ({nbytes / args.rows:.0f} B/row); "
              f"answers: {sorted(answers)}; every key measured {args.repeats}x; runs: {args.runs}")
        header = ("measure", "seconds", "peak RSS MiB", "peak / decoded Arrow size", "B/row at peak")
        rows = []
        for label, xs in results.items():
            sec = [x[0] for x in xs]
            peak = max(x[1] for x in xs)
            rows.append((label, f"{statistics.median(sec):.2f} ({min(sec):.2f}-{max(sec):.2f})", f"{peak:.0f}",
                         f"{peak * 2**20 / nbytes:.2f}x", f"{peak * 2**20 / args.rows:.0f}"))
        widths = [max(len(r[i]) for r in [*rows, header]) for i in range(len(header))]
        print(" | ".join(h.ljust(w) for h, w in zip(header, widths)))
        print("-+-".join("-" * w for w in widths))
        for row in rows:
            print(" | ".join(v.ljust(w) for v, w in zip(row, widths)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
