"""The catalog scan remembered across processes (modperf.data.scan_cache): a record is served only
while a scan now would find the same; correctness, never speed.

A record is written only when no folder it lists changed within ``RACY_NS`` of the scan (a
change in the same timestamp tick could leave a folder's times unchanged). The tests build
their data roots just before scanning them, so they shorten that window to 50 ms and wait it
out (``settle``) after each change; the rule itself is the same."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.helpers import run_cli

import modperf
from modperf import errors as E
from modperf.base import jsonio
from modperf.data import cache_info, scan_cache
from modperf.data.catalog import Catalog
from modperf.fast import cache_keys, persist
from modperf.fast.cache_keys import embedded_data_root
from modperf.specs import roofline

SPARSE = "b300_sxm/sparse_attention/vllm"  # 0.22.0 declares reuse of 0.24.0's dsa tables
MLA = "b300_sxm/mla/vllm/0.24.0"
WINDOW_NS = 50_000_000


@pytest.fixture
def short_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan_cache, "RACY_NS", WINDOW_NS)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A data root of real corpus folders: one with a reuse.yaml, its donor, and another family."""
    corpus = embedded_data_root()
    out = tmp_path / "root"
    for part in (SPARSE, MLA):
        shutil.copytree(corpus / part, out / part)
    return out


def settle() -> None:
    time.sleep(2 * WINDOW_NS / 1e9)


def records(cache_dir: Path) -> list[Path]:
    return sorted((cache_dir / scan_cache.FOLDER).glob("*" + scan_cache.SUFFIX))


def same(a: Catalog, b: Catalog) -> None:
    assert a.root == b.root
    assert a.files == b.files and a.slots == b.slots
    assert [str(p) for p in a.problems] == [str(p) for p in b.problems]
    assert [type(r.path) for r in a.files + a.slots] == [type(r.path) for r in b.files + b.slots]


def summary(catalog: Catalog) -> tuple:
    return catalog.files, catalog.slots, [str(p) for p in catalog.problems]


def recorded(root: Path, cache_dir: Path) -> Catalog:
    """Scan ``root`` through a record that exists and is current (asserting it was served)."""
    entry = scan_cache.record_path(root, cache_dir)
    before = entry.read_bytes()
    os.utime(entry, ns=(0, 0))
    found = scan_cache.scan(root)
    assert entry.read_bytes() == before and entry.stat().st_mtime_ns > 0  # read (and marked used), not rewritten
    return found


def test_a_recorded_scan_is_the_scan(root: Path, cache_dir: Path, short_window: None) -> None:
    settle()
    first = scan_cache.scan(root)
    assert len(records(cache_dir)) == 1
    fresh = Catalog.scan(root)
    same(first, fresh)
    again = recorded(root, cache_dir)
    same(again, fresh)
    reused = again.slot("b300_sxm", "vllm", "0.22.0", "dsa_context_module")
    assert reused is not None and reused.reuse == fresh.slot(*reused.slot).reuse and reused.path.parts[-2] == "0.24.0"
    assert reused.reuse is not None and reused.reuse.from_version == "0.24.0"


def test_the_corpus_scan_is_recorded_and_served(cache_dir: Path) -> None:
    first = scan_cache.scan()
    same(first, Catalog.scan())
    same(recorded(embedded_data_root(), cache_dir), Catalog.scan())


def _add_table(root: Path) -> None:
    shutil.copyfile(root / MLA / "mla_context_module_perf.parquet",
                    root / SPARSE / "0.24.0" / "mla_context_module_perf.parquet")


def _new_version(root: Path) -> None:
    shutil.copytree(root / MLA, root / "b300_sxm/mla/vllm/0.25.0rc1")


def _remove_table(root: Path) -> None:
    (root / MLA / "mla_generation_module_perf.parquet").unlink()


def _rename_table(root: Path) -> None:
    os.rename(root / MLA / "mla_generation_module_perf.parquet", root / MLA / "mla_generation_module_perf.txt")


def _legacy_csv_beside(root: Path) -> None:
    (root / MLA / "msa_context_module_perf.txt").write_text("a,b\n1,2\n")


def _reuse_edited_in_place(root: Path) -> None:
    """Same size, same mtime (put back): only the bytes differ."""
    path = root / SPARSE / "0.22.0" / "reuse.yaml"
    st = path.stat()
    text = path.read_text()
    assert "0.24.0" in text
    path.write_text(text.replace("0.24.0", "0.24.9"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _reuse_added(root: Path) -> None:
    (root / MLA / "reuse.yaml").write_text("reuse:\n- table: mla_generation_module_perf\n  from_version: 0.22.0\n")


def _new_system(root: Path) -> None:
    shutil.copytree(root / MLA, root / "h200_sxm/mla/vllm/0.24.0")


def _folder_emptied(root: Path) -> None:
    shutil.rmtree(root / SPARSE / "0.22.0")


def _temp_file(root: Path) -> None:
    (root / MLA / ".mla_context_module_perf.parquet.x1y2.modperf-tmp").write_bytes(b"half")


def _folder_times_put_back(root: Path) -> None:
    """A table added, then the folder's mtime put back (its ctime cannot be)."""
    folder = root / MLA
    st = folder.stat()
    shutil.copyfile(folder / "mla_context_module_perf.parquet", folder / "msa_context_module_perf.parquet")
    os.utime(folder, ns=(st.st_atime_ns, st.st_mtime_ns))


CHANGES = [_new_version, _add_table, _remove_table, _rename_table, _legacy_csv_beside, _reuse_edited_in_place,
           _reuse_added, _new_system, _folder_emptied, _temp_file, _folder_times_put_back]


@pytest.mark.parametrize("change", CHANGES, ids=[c.__name__.strip("_") for c in CHANGES])
def test_any_change_to_the_data_root_is_seen(root: Path, cache_dir: Path, short_window: None, change) -> None:
    settle()
    scan_cache.scan(root)
    before = recorded(root, cache_dir)
    settle()
    change(root)
    found = scan_cache.scan(root)
    same(found, Catalog.scan(root))
    assert summary(found) != summary(before)  # the change is one a scan sees


def test_a_folder_that_can_no_longer_be_listed_is_seen(root: Path, cache_dir: Path, short_window: None) -> None:
    if os.geteuid() == 0:
        pytest.skip("root lists any folder")
    settle()
    scan_cache.scan(root)
    settle()
    folder = root / MLA
    folder.chmod(0)
    try:
        found = scan_cache.scan(root)
        assert [type(p) for p in found.problems] == [E.UnreadableFolderError]
        same(found, Catalog.scan(root))
    finally:
        folder.chmod(0o755)


def test_a_permission_change_is_seen_even_when_it_reads_the_same(root: Path, cache_dir: Path,
                                                                 short_window: None) -> None:
    """chmod changes a folder's ctime, not its mtime: the record stands for what it was taken of."""
    settle()
    scan_cache.scan(root)
    entry = scan_cache.record_path(root, cache_dir)
    first = entry.read_bytes()
    settle()
    (root / MLA).chmod(0o700)
    settle()
    same(scan_cache.scan(root), Catalog.scan(root))
    assert entry.read_bytes() != first  # scanned again and recorded anew


def test_a_scan_just_after_a_change_is_not_recorded(root: Path, cache_dir: Path) -> None:
    """The default window (2 s): the root was written just now."""
    same(scan_cache.scan(root), Catalog.scan(root))
    assert records(cache_dir) == []


def test_untrusted_scans_are_not_recorded(root: Path, cache_dir: Path, short_window: None) -> None:
    (root / SPARSE / "0.22.0" / "reuse.yaml").write_text("reuse: 7\n")  # a problem
    settle()
    found = scan_cache.scan(root)
    assert [type(p) for p in found.problems] == [E.SidecarError]
    assert records(cache_dir) == []
    (root / SPARSE / "0.22.0" / "reuse.yaml").unlink()
    link = root / "b300_sxm/mla/vllm/0.23.0"
    link.symlink_to(root / MLA)  # a link inside the root: found, but where it points may change
    settle()
    found = scan_cache.scan(root)
    assert found.problems == [] and found.slot("b300_sxm", "vllm", "0.23.0", "mla_context_module") is not None
    assert records(cache_dir) == []
    link.unlink()
    settle()
    scan_cache.scan(root)
    assert len(records(cache_dir)) == 1
    (root / MLA / "reuse.yaml").symlink_to(root / "nowhere.yaml")  # a dangling sidecar link
    settle()
    same(scan_cache.scan(root), Catalog.scan(root))
    assert records(cache_dir) == []  # the record that no longer holds is removed, none written
    (root / MLA / "reuse.yaml").unlink()
    settle()
    scan_cache.scan(root)
    assert len(records(cache_dir)) == 1


@pytest.mark.parametrize("damage", ["truncated", "flipped", "digest", "garbage", "empty", "other_root"])
def test_a_damaged_record_is_scanned_again_and_replaced(root: Path, cache_dir: Path, short_window: None,
                                                        damage: str) -> None:
    settle()
    scan_cache.scan(root)
    entry = scan_cache.record_path(root, cache_dir)
    good = entry.read_bytes()
    if damage == "truncated":
        bad = good[: len(good) // 2]
    elif damage == "flipped":  # a byte of a table file's name
        i = good.index(b"mla_context_module_perf.parquet")
        bad = good[:i] + b"n" + good[i + 1:]
    elif damage == "digest":
        bad = good[:-1] + bytes([good[-1] ^ 1])
    elif damage == "garbage":
        bad = b"not a record at all" * 10
    elif damage == "empty":
        bad = b""
    else:  # a whole, valid record of another data root under this one's name
        other = root.parent / "other"
        shutil.copytree(root / MLA, other / MLA)
        settle()
        scan_cache.scan(other)
        bad = scan_cache.record_path(other, cache_dir).read_bytes()
    entry.write_bytes(bad)
    same(scan_cache.scan(root), Catalog.scan(root))
    assert entry.read_bytes() == good  # rewritten whole (the same scan, the same record)


def test_a_relative_root_is_recorded_as_its_folder(root: Path, cache_dir: Path, short_window: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The same relative name from another working folder is another data root."""
    other = root.parent / "elsewhere" / "root"
    shutil.copytree(root / MLA, other / MLA)
    settle()
    monkeypatch.chdir(root.parent)
    first = scan_cache.scan("root")
    assert first.root == Path("root") and len(first.slots) == len(Catalog.scan(root).slots)
    monkeypatch.chdir(other.parent)
    found = scan_cache.scan("root")
    same(found, Catalog.scan("root"))
    assert len(found.slots) == 2 and len(records(cache_dir)) == 2
    monkeypatch.chdir(root.parent)
    same(recorded(Path("root"), cache_dir), Catalog.scan("root"))


def test_no_cache_means_no_record(root: Path, cache_dir: Path, short_window: None,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    settle()
    modperf.open(root, cache=False)
    assert not cache_dir.exists()
    monkeypatch.setenv(cache_keys.NO_CACHE_ENV, "1")
    modperf.open(root)
    assert not cache_dir.exists()
    monkeypatch.delenv(cache_keys.NO_CACHE_ENV)
    db = modperf.open(root)  # (with the cache on, the catalog is scanned on first use)
    catalog = db.catalog
    assert len(records(cache_dir)) == 1
    same(catalog, Catalog.scan(root))


def test_an_unwritable_cache_folder_is_a_note(root: Path, tmp_path: Path, short_window: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv(cache_keys.CACHE_DIR_ENV, str(blocker / "cache"))
    settle()
    same(scan_cache.scan(root), Catalog.scan(root))
    assert any("catalog scan not recorded" in n for n in persist.NOTES)


def test_cache_info_lists_records_and_clear_removes_them(root: Path, cache_dir: Path, short_window: None) -> None:
    settle()
    scan_cache.scan(root)
    (entry,) = records(cache_dir)
    info = cache_info.info()
    assert [(r.file, r.bytes, r.root) for r in info.catalogs] == [(entry, entry.stat().st_size, str(root))]
    assert info.to_dict()["catalogs"] == [{"file": str(entry), "bytes": entry.stat().st_size,
                                           "data_root": str(root)}]
    cli = run_cli(["cache", "info", "--json"])
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["catalogs"][0]["data_root"] == str(root)
    text = run_cli(["cache", "info"])
    assert text.returncode == 0 and "1 catalog scan" in text.stdout
    cleared = run_cli(["cache", "clear", "--json"])
    assert cleared.returncode == 0, cleared.stderr
    assert json.loads(cleared.stdout)["catalogs_removed"] == 1
    assert records(cache_dir) == []


def test_records_are_bounded(tmp_path: Path, cache_dir: Path, short_window: None,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan_cache, "MAX_RECORDS", 2)
    roots = []
    for i in range(3):
        r = tmp_path / f"r{i}"
        (r / MLA).mkdir(parents=True)
        roots.append(r)
    settle()
    for r in roots:
        scan_cache.scan(r)
        time.sleep(0.01)
    assert sorted(p.name for p in records(cache_dir)) == sorted(
        scan_cache.record_path(r, cache_dir).name for r in roots[1:])


_CHILD = """
import json, sys
import modperf
from modperf.specs.roofline import gpu_spec
def heavy():
    return sorted(m for m in sys.modules if m.split(".")[0] in ("pyarrow", "yaml")
                  or m in ("modperf.data.reader", "modperf.data.validate", "modperf.data.conventions", "modperf.data.codes",
                           "importlib.metadata"))
db = modperf.open()
opened = heavy()
latency = db.answer(json.loads(sys.argv[1]), quality=False).latency_ms.hex()
print(json.dumps({"latency": latency, "opened": opened, "answered": heavy(), "gpu": repr(gpu_spec("h200_sxm"))}))
"""


def test_a_process_answering_from_the_cache_reads_no_parquet_and_no_yaml(cache_dir: Path) -> None:
    """Its tables come from keyed-table entries, its catalog and the GPU spec documents from
    the scan record: it imports neither pyarrow nor yaml, nor reading, validation or
    conventions; the answer and the GPU spec are the same. (A process finding the question's
    persisted plan reads neither the record nor an entry: its plans are removed here first.)"""
    fields = {"table": "mla_context_module", "system": "h200_sxm", "backend": "trtllm", "version": "1.3.0rc20",
              "model": "deepseek-ai/DeepSeek-V3", "tp_size": 8, "batch_size": 4, "isl": 1024}
    want = modperf.open(cache=False).answer(fields, quality=False).latency_ms.hex()
    env = {**os.environ, cache_keys.CACHE_DIR_ENV: str(cache_dir)}
    runs = []
    for _ in range(2):
        runs.append(subprocess.run([sys.executable, "-c", _CHILD, json.dumps(fields)], capture_output=True, text=True,
                                   env=env, timeout=120))
        shutil.rmtree(cache_dir / "plans")
    for r in runs:
        assert r.returncode == 0, r.stderr
    first, second = (json.loads(r.stdout) for r in runs)
    assert first["latency"] == second["latency"] == want
    assert first["gpu"] == second["gpu"] and "from_file=True" in first["gpu"]
    assert first["opened"] == []  # opening scans nothing until the first answer needs it
    assert "yaml" in first["answered"]  # the first process scanned the corpus (reuse.yaml)
    assert "pyarrow" in first["answered"]  # and keyed the table from its file
    assert second["opened"] == second["answered"] == []


def test_a_spec_document_is_handed_over_only_for_the_same_text(tmp_path: Path) -> None:
    spec = tmp_path / "x_sxm.yaml"
    text = f"gpu:\n  mem_bw: 1.0e+12\n  bfloat16_tc_flops: 2.0e+15\n# {tmp_path}\n"
    spec.write_text(text)
    parsed = roofline.spec_document(text)
    assert parsed == {"gpu": {"mem_bw": 1.0e12, "bfloat16_tc_flops": 2.0e15}}
    edited = text.replace("1.0e+12", "3.0e+12")
    documents = [[str(spec), scan_cache._sidecar_digest(text.encode()), jsonio.tagged({"gpu": {"mem_bw": 7.0}})]]
    spec.write_text(edited)
    scan_cache._hand_over_documents(documents)
    assert edited not in roofline._DOCUMENTS  # the file changed: nothing handed over
    assert roofline.spec_document(edited) == {"gpu": {"mem_bw": 3.0e12, "bfloat16_tc_flops": 2.0e15}}
    again = text.replace("# ", "# again ")
    spec.write_text(again)
    documents = [[str(spec), scan_cache._sidecar_digest(again.encode()), jsonio.tagged({"gpu": {"mem_bw": 7.0}})]]
    scan_cache._hand_over_documents(documents)
    assert roofline.spec_document(again) == {"gpu": {"mem_bw": 7.0}}  # the same text: taken as remembered


@pytest.mark.parametrize("value, exact", [
    ({"a": [1, 2.5, "x", None, True]}, True), ({1: "int key", "t": (1, 2)}, True), ({"a": float("nan")}, True),
    ({"a": {"b": datetime.date(2026, 1, 1)}}, False), ({"a": b"bytes"}, False),
])
def test_only_documents_json_holds_exactly_are_remembered(value, exact: bool) -> None:
    tagged = jsonio.tagged(value)
    assert scan_cache._exact_json(tagged) is exact
    if exact:
        back = jsonio.untagged(json.loads(json.dumps(tagged)))
        assert repr(back) == repr(value)


def test_the_corpus_spec_documents_are_remembered(cache_dir: Path) -> None:
    """Every system of the corpus with a spec file: the documents come back equal to a parse."""
    scan_cache.scan()
    data = scan_cache.record_path(embedded_data_root(), cache_dir).read_bytes()
    documents = json.loads(data[len(scan_cache.MAGIC):-32])["documents"]
    systems = {r.system for r in Catalog.scan().files}
    assert {Path(f).stem for f, _, _ in documents} == {s for s in systems
                                                      if (embedded_data_root().parent / f"{s}.yaml").is_file()}
    for file, _, tagged in documents:
        parsed = roofline.spec_document(Path(file).read_text())
        assert repr(jsonio.untagged(tagged)) == repr(parsed)
