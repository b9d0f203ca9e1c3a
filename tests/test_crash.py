"""kill -9 at random points of every write modperf makes: ``migrate --execute``, ``dedupe --write``
and the collector-side writer. After each kill every file holds its old bytes or its new,
verified bytes (never a torn file); the next run finishes the job and leaves no temporary file
behind. A larger campaign: ``python bench/crash.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from tests.helpers import (
    STALE_DIR,
    CrashServer,
    files_of,
    kill_campaign,
    writable_copy,
)

from modperf.data.catalog import refs_for_paths
from modperf.data.loader import load_one
from modperf.specs.models import ModelRegistry

#: Kills per write; each is a full run up to the kill and a full re-run (the suite's budget: the
#: stratified points still kill before the first rename and after the last; bench/crash.py runs more).
TRIALS = 8
ALIAS = "02_alias_duplication/githead_095f58a51"
CSA_GEN = "07_latent_collision/wheel/b200_sxm/sparse_attention/sglang/0.5.14/dsv4_csa_generation_module_perf.parquet"
PRO = "deepseek-ai/DeepSeek-V4-Pro"


@pytest.fixture(scope="module")
def server() -> Iterator[CrashServer]:
    s = CrashServer()
    yield s
    s.close()


def loads_clean(folder: Path, registry: ModelRegistry) -> None:
    for ref in refs_for_paths([folder]):
        loaded = load_one(ref, registry)
        assert loaded.ok, [str(f) for f in loaded.failures]


def test_kill_9_during_migrate_execute(server: CrashServer, fixtures: Path, tmp_path: Path, fixture_models) -> None:
    work = writable_copy(fixtures / STALE_DIR, tmp_path / "stale")
    old = files_of(work)
    argv = {"argv": ["migrate", str(work), "--execute", "--model-configs", str(fixtures / "09_hf_configs")]}
    clean = server.run("cli", argv)
    assert clean["code"] == 0, clean
    new = files_of(work)
    changed = sorted(rel for rel in new if new[rel] != old[rel])
    assert len(changed) == 5  # the five stale tables, rewritten in place
    loads_clean(work, fixture_models)  # the new bytes are the verified ones
    stats = kill_campaign(server, "cli", argv, work, old, new, TRIALS, seed=12)
    assert stats["trials"] == TRIALS and stats["debris_after_next_run"] == 0
    assert stats["files_old"] > 0 and stats["files_new"] > 0  # kills landed before and after renames


def test_kill_9_during_dedupe_write(server: CrashServer, fixtures: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    source = str(fixtures / ALIAS)
    # the old content: an earlier dedupe that chose other canonical names (other bytes)
    earlier = server.run("cli", {"argv": ["dedupe", source, "--write", str(out), "--prefer", "nvidia/DeepSeek-V3.1-NVFP4",
                                          "--prefer", "zai-org/GLM-5-FP8"]})
    assert earlier["code"] == 0, earlier
    old = files_of(out)
    argv = {"argv": ["dedupe", source, "--write", str(out)]}
    clean = server.run("cli", argv)
    assert clean["code"] == 0, clean
    new = files_of(out)
    assert len(new) == 3 and all(new[rel] != old[rel] for rel in new)
    loads_clean(out, ModelRegistry.default())
    stats = kill_campaign(server, "cli", argv, out, old, new, TRIALS, seed=13)
    assert stats["trials"] == TRIALS and stats["debris_after_next_run"] == 0
    assert stats["files_old"] > 0 and stats["files_new"] > 0


def test_kill_9_during_writer_close(server: CrashServer, fixtures: Path, tmp_path: Path) -> None:
    table = pq.read_table(fixtures / CSA_GEN)
    rows = tmp_path / "rows.parquet"
    pq.write_table(table.filter(pc.equal(table.column("model"), PRO)), rows)
    root = tmp_path / "root"
    args = {"rows": str(rows), "root": str(root), "table": "dsv4_csa_generation_module", "system": "b200_sxm",
            "backend": "sglang", "model": PRO, "scale": 2.0}
    assert server.run("writer", args)["code"] == 0  # the old table: every latency doubled
    old = files_of(root)
    args = {**args, "scale": 1.0}
    clean = server.run("writer", args)
    assert clean["code"] == 0, clean
    new = files_of(root)
    assert sorted(new) == ["b200_sxm/sparse_attention/sglang/0.5.14/collection_meta.yaml",
                           "b200_sxm/sparse_attention/sglang/0.5.14/dsv4_csa_generation_module_perf.parquet"]
    loads_clean(root, ModelRegistry.default())

    def same(rel: str, a: bytes, b: bytes) -> bool:
        if rel.endswith(".yaml"):  # the sidecar records the day it was written: compare what it says
            da, db = yaml.safe_load(a), yaml.safe_load(b)
            for d in (da, db):
                d["tables"]["dsv4_csa_generation_module_perf"].pop("collected_at")
            return bool(da == db)
        return a == b

    stats = kill_campaign(server, "writer", args, root, old, new, TRIALS, seed=14, same=same)
    assert stats["trials"] == TRIALS and stats["debris_after_next_run"] == 0
    assert stats["files_new"] > 0
