"""kill -9 campaign: many SIGKILLs at points spread over each write modperf makes
(``migrate --execute``, ``dedupe --write``, the collector-side writer), the same checks as
tests/test_crash.py at a larger scale. After every kill each file must hold its old or its new
bytes; the next run must finish the write and leave no temporary file. Prints one row per write.

    python bench/crash.py                # 100 kills per write (about 4 minutes on 2 cores)
    python bench/crash.py --trials 30
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import yaml  # noqa: E402
from tests.helpers import FIXTURES, STALE_DIR, CrashServer, files_of, kill_campaign, writable_copy  # noqa: E402

ALIAS = "02_alias_duplication/githead_095f58a51"
CSA_GEN = "07_latent_collision/wheel/b200_sxm/sparse_attention/sglang/0.5.14/dsv4_csa_generation_module_perf.parquet"
PRO = "deepseek-ai/DeepSeek-V4-Pro"


def _sidecar_same(rel: str, a: bytes, b: bytes) -> bool:
    if rel.endswith(".yaml"):
        da, db = yaml.safe_load(a), yaml.safe_load(b)
        for d in (da, db):
            for entry in (d.get("tables") or {}).values():
                entry.pop("collected_at", None)
        return bool(da == db)
    return a == b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100, help="kills per write")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="modperf-crash-"))
    server = CrashServer()
    rows = []
    try:
        # migrate --execute: five stale tables rewritten in place
        work = writable_copy(FIXTURES / STALE_DIR, tmp / "stale")
        old = files_of(work)
        argv = {"argv": ["migrate", str(work), "--execute", "--model-configs", str(FIXTURES / "09_hf_configs")]}
        assert server.run("cli", argv)["code"] == 0
        new = files_of(work)
        start = time.perf_counter()
        stats = kill_campaign(server, "cli", argv, work, old, new, args.trials, args.seed)
        rows.append(("migrate --execute (5 tables)", stats, time.perf_counter() - start))
        # dedupe --write: three tables over an earlier output with other canonical names
        out, source = tmp / "out", str(FIXTURES / ALIAS)
        assert server.run("cli", {"argv": ["dedupe", source, "--write", str(out), "--prefer",
                                           "nvidia/DeepSeek-V3.1-NVFP4", "--prefer", "zai-org/GLM-5-FP8"]})["code"] == 0
        old = files_of(out)
        argv = {"argv": ["dedupe", source, "--write", str(out)]}
        assert server.run("cli", argv)["code"] == 0
        new = files_of(out)
        start = time.perf_counter()
        stats = kill_campaign(server, "cli", argv, out, old, new, args.trials, args.seed + 1)
        rows.append(("dedupe --write (3 tables)", stats, time.perf_counter() - start))
        # the writer: 1600 rows replayed over an earlier table (latencies doubled), table + sidecar
        table = pq.read_table(FIXTURES / CSA_GEN)
        pq.write_table(table.filter(pc.equal(table.column("model"), PRO)), tmp / "rows.parquet")
        wargs = {"rows": str(tmp / "rows.parquet"), "root": str(tmp / "root"), "table": "dsv4_csa_generation_module",
                 "system": "b200_sxm", "backend": "sglang", "model": PRO, "scale": 2.0}
        assert server.run("writer", wargs)["code"] == 0
        old = files_of(tmp / "root")
        wargs["scale"] = 1.0
        assert server.run("writer", wargs)["code"] == 0
        new = files_of(tmp / "root")
        start = time.perf_counter()
        stats = kill_campaign(server, "writer", wargs, tmp / "root", old, new, args.trials, args.seed + 2,
                              same=_sidecar_same)
        rows.append(("writer close (table + sidecar)", stats, time.perf_counter() - start))
    finally:
        server.close()
        shutil.rmtree(tmp, ignore_errors=True)
    head = ("write", "trials", "killed", "files old", "files new", "torn", "debris before re-run",
            "debris after re-run", "s")
    print(" | ".join(head))
    for name, s, seconds in rows:
        print(" | ".join(map(str, (name, s["trials"], s["killed"], s["files_old"], s["files_new"], 0,
                                   s["debris_before_next_run"], s["debris_after_next_run"], f"{seconds:.0f}"))))
    print("torn = a file that is neither its old nor its new bytes (the campaign stops at the first one)")


if __name__ == "__main__":
    main()
