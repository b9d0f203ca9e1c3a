"""modperf.base.atomic: the one write path. Temporary files say whose they are and the next write
removes only those it proves stale; symbolic links are followed only on purpose; a file's
owner stamp; a full disk leaves no file (real EFBIG writes: RLIMIT_FSIZE in a child process)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.helpers import REPO, STALE_DIR, run_cli, snapshot, strict_json, writable_copy

from modperf import errors as E
from modperf.base.atomic import (
    TMP_SUFFIX,
    is_live_temp,
    is_stale_temp,
    stage,
    sweep,
    temp_files,
    temp_owner,
    text_writer,
    write_atomically,
)
from modperf.data.parquet_files import parquet_writer, written_by_modperf

ALIAS = "02_alias_duplication/githead_095f58a51"


def dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def temp_like(folder: Path, target: str, pid: int, start: str | None = None, host: str | None = None) -> Path:
    """A temporary file named as modperf names them, for process ``pid`` on this host."""
    probe = folder.parent / f"{folder.name}-probe"
    staged = stage(probe / target, text_writer("x"), overwrite=True)  # learns host, boot and start time
    host_, boot, _, start_ = temp_owner(staged.temp)  # type: ignore[misc]
    staged.discard()
    path = folder / ("~".join((f".{target}", host or host_, boot, str(pid), start or start_, "cafe0001")) + TMP_SUFFIX)
    path.write_bytes(b"half a table")
    return path


def test_a_temp_file_names_its_writer(tmp_path: Path) -> None:
    staged = stage(tmp_path / "t.txt", text_writer("hello"), overwrite=False)
    owner = temp_owner(staged.temp)
    assert owner is not None and owner[2] == os.getpid()
    assert staged.temp.name.startswith(".t.txt~") and staged.temp.name.endswith(TMP_SUFFIX)
    assert is_live_temp(staged.temp) and not is_stale_temp(staged.temp)  # this process is writing it
    staged.commit()
    assert (tmp_path / "t.txt").read_text() == "hello" and temp_files(tmp_path) == []


def test_only_provably_stale_temp_files_are_removed(tmp_path: Path) -> None:
    dead = temp_like(tmp_path, "a_perf.parquet", dead_pid())
    live = temp_like(tmp_path, "b_perf.parquet", os.getpid())
    reused = temp_like(tmp_path, "c_perf.parquet", os.getpid(), start="1")  # our pid, but another start time
    elsewhere = temp_like(tmp_path, "d_perf.parquet", dead_pid(), host="another-host")
    legacy = tmp_path / ".e_perf.parquet.k2j3h4.modperf-tmp"  # the old naming: whose, cannot be told
    legacy.write_bytes(b"x")
    assert [is_stale_temp(p) for p in (dead, live, reused, elsewhere, legacy)] == [True, False, True, False, False]
    assert sweep(tmp_path) == sorted([dead, reused])
    assert temp_files(tmp_path) == sorted([live, elsewhere, legacy])
    # and a write into the folder sweeps first
    again = temp_like(tmp_path, "f_perf.parquet", dead_pid())
    write_atomically(tmp_path / "g.txt", text_writer("g"), overwrite=False)
    assert not again.exists() and live.exists()


def test_symlinks_are_followed_only_on_purpose(tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    with pytest.raises(E.TargetExistsError, match="target is a symbolic link; it is not replaced"):
        write_atomically(link, text_writer("new"), overwrite=True)
    assert real.read_text() == "old" and link.is_symlink()
    write_atomically(link, text_writer("new"), overwrite=True, follow_symlink=True)
    assert link.is_symlink() and real.read_text() == "new"  # the target is rewritten, the link stays
    with pytest.raises(E.TargetExistsError, match="target is a folder"):
        write_atomically(tmp_path, text_writer("x"), overwrite=True)


def test_the_owner_stamp(tmp_path: Path) -> None:
    table = pa.table({"a": [1, 2]})
    write_atomically(tmp_path / "mine.parquet", parquet_writer(table, owner="modperf test"), overwrite=False)
    pq.write_table(table, tmp_path / "theirs.parquet")
    (tmp_path / "notes.parquet").write_text("not parquet")
    assert written_by_modperf(tmp_path / "mine.parquet")
    assert not written_by_modperf(tmp_path / "theirs.parquet") and not written_by_modperf(tmp_path / "notes.parquet")
    assert pq.read_table(tmp_path / "mine.parquet").equals(table)


def _limit_file_size(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    return apply


def test_disk_full_during_dedupe_write_says_which_tables_were_written(fixtures: Path, tmp_path: Path) -> None:
    """Files over 100 kB cannot be written (EFBIG, as a full disk gives ENOSPC): the two MLA
    tables (66 and 75 kB) are written and verified, the DSA table (135 kB) is not, the report
    says so per table, exit 1, and no file or temporary file of the failed table exists."""
    out = tmp_path / "out"
    for extra in ([], ["--json"]):
        result = run_cli(["dedupe", str(fixtures / ALIAS), "--write", str(out), *extra],
                         preexec_fn=_limit_file_size(100_000))
        assert result.returncode == 1, result.stderr
        if extra:
            report = strict_json(result.stdout)
            written = {Path(f["path"]).name: f["written"] for f in report["files"]}
            assert {k: v["written"] for k, v in written.items()} == {
                "dsa_generation_module_perf.parquet": False, "mla_context_module_perf.parquet": True,
                "mla_generation_module_perf.parquet": True}
            failure = written["dsa_generation_module_perf.parquet"]["failures"][0]
            assert failure["kind"] == "write_failed" and "File too large" in failure["message"]
        else:
            assert "NO (write_failed)" in result.stdout and result.stdout.count("yes, verified") == 2
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["h200_sxm/mla/vllm/0.22.0/mla_context_module_perf.parquet",
                     "h200_sxm/mla/vllm/0.22.0/mla_generation_module_perf.parquet"]


def test_disk_full_during_migrate_leaves_the_original(fixtures: Path, tmp_path: Path) -> None:
    work = writable_copy(fixtures / STALE_DIR, tmp_path / "stale")
    before = snapshot(work)
    result = run_cli(["migrate", str(work), "--execute", "--json"], preexec_fn=_limit_file_size(4_000))
    assert result.returncode == 1
    report = strict_json(result.stdout)
    assert report["summary"]["written"] == 0
    assert [r["kind"] for f in report["files"] for r in f["refusals"]] == ["write_failed"]
    assert snapshot(work) == before  # every original byte, and no temporary file


def test_disk_full_at_writer_close_keeps_the_session(fixtures: Path, tmp_path: Path) -> None:
    """close() on a full disk raises WriteFailedError and keeps every measurement: once there is
    room, close() again writes them all."""
    script = f"""
import json, resource, sys
sys.path.insert(0, {str(REPO)!r})
import pyarrow.compute as pc, pyarrow.parquet as pq
from modperf import errors as E
from modperf.audit.writer import open_writer
from tests.helpers import split_columns
t = pq.read_table({str(fixtures / "07_latent_collision/wheel/b200_sxm/sparse_attention/sglang/0.5.14/dsv4_csa_generation_module_perf.parquet")!r})
rows = t.filter(pc.equal(t.column("model"), "deepseek-ai/DeepSeek-V4-Pro"))
fixed, per_row = split_columns(rows, ("latency", "num_heads"))
version = fixed.pop("version"); fixed.pop("model")
w = open_writer("dsv4_csa_generation_module", root={str(tmp_path / "root")!r}, system="b200_sxm", backend="sglang",
                version=version, model="deepseek-ai/DeepSeek-V4-Pro", **fixed)
cols = {{n: rows.column(n).to_pylist() for n in (*per_row, "latency")}}
for i in range(rows.num_rows):
    w.add(cols["latency"][i], **{{n: cols[n][i] for n in per_row}})
resource.setrlimit(resource.RLIMIT_FSIZE, (2000, resource.RLIM_INFINITY))
try:
    w.close()
    first = "written"
except E.WriteFailedError as exc:
    first = exc.kind
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
result = w.close()
print(json.dumps({{"first": first, "rows": result.rows, "kept": len(w)}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"first": "write_failed", "rows": 1600, "kept": 1600}
    folder = tmp_path / "root/b200_sxm/sparse_attention/sglang/0.5.14"
    assert sorted(p.name for p in folder.iterdir()) == ["collection_meta.yaml",
                                                      "dsv4_csa_generation_module_perf.parquet"]
