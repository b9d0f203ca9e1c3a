"""A collective library's table filed in a framework folder (issue 21): the embedded corpus's
NCCL table in ``b300_sxm/comm/trtllm/1.3.0rc10/``, whose rows record release 2.29.2. It is read
as that release: served in its slot where nothing else claims it (every answer names the file),
compared key by key with that release's own file where there is one (a warning when it only
re-measures it), and a failure where some of its data would be read nowhere. The persisted
caches (catalog scan records, query plans) follow where it is served."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tests.helpers import REPO, run_cli, stored_latency

import modperf
from modperf import errors as E
from modperf.audit.check import check
from modperf.data import scan_cache
from modperf.data.catalog import Catalog
from modperf.fast.cache_keys import embedded_data_root

FRAMEWORK = ("b300_sxm", "comm", "trtllm", "1.3.0rc10")
RELEASE = ("b300_sxm", "comm", "nccl", "2.29.2")
ASK = {"table": "nccl", "system": "b300_sxm", "backend": "nccl", "version": "2.29.2", "op_name": "all_reduce",
       "nccl_dtype": "half", "num_gpus": 8, "message_size": 16777216}
WHERE = {"op_name": "all_reduce", "nccl_dtype": "half", "num_gpus": 8, "message_size": 16777216}
#: The misplaced file's three runs at ASK are 0.16678, 0.1682 and 0.1689 ms (the lower median
#: answers); the release's own file measured 0.16686 once.
MISPLACED_MS = 0.1682
PLACED_MS = 0.16686
WINDOW_NS = 50_000_000


def corpus_file(folder: tuple[str, ...]) -> Path:
    return embedded_data_root().joinpath(*folder, "nccl_perf.parquet")


def filed(root: Path, folder: tuple[str, ...], source: Path | None = None, table: pa.Table | None = None) -> Path:
    """A copy of a real file (or a table) at ``root/folder/nccl_perf.parquet``."""
    out = root.joinpath(*folder, "nccl_perf.parquet")
    out.parent.mkdir(parents=True, exist_ok=True)
    if table is not None:
        pq.write_table(table, out)
    else:
        shutil.copyfile(source or corpus_file(FRAMEWORK), out)
    return out


def note(file: Path, release: str = "2.29.2") -> str:
    return (f"served from {file}, filed in the framework folder b300_sxm/comm/trtllm/1.3.0rc10/: read as nccl "
            f"release {release} (the release its rows record); it belongs in b300_sxm/comm/nccl/{release}/")


def test_the_embedded_file_is_the_one_the_answer_reads() -> None:
    """The figures below are the real files' (read with pyarrow alone)."""
    assert stored_latency(corpus_file(FRAMEWORK), WHERE) == MISPLACED_MS
    assert stored_latency(corpus_file(RELEASE), WHERE) == PLACED_MS
    assert sorted(pq.read_table(corpus_file(FRAMEWORK)).column("version").unique().to_pylist()) == ["2.29.2"]


def test_served_under_the_release_its_rows_record(tmp_path: Path) -> None:
    file = filed(tmp_path, FRAMEWORK)
    catalog = Catalog.scan(tmp_path)
    (physical,) = catalog.files
    assert physical.label == "b300_sxm/comm/trtllm/1.3.0rc10/nccl" and physical.misplaced is not None
    assert physical.misplaced.served_as == "b300_sxm/nccl/2.29.2" and physical.misplaced.held_by is None
    (slot,) = catalog.slots  # served in the release's slot only, not in the framework folder's
    assert slot.slot == ("b300_sxm", "nccl", "2.29.2", "nccl") and slot.path == file
    assert slot.label == "b300_sxm/comm/nccl/2.29.2/nccl"

    answer = modperf.open(tmp_path, cache=False).query(**ASK)
    assert (answer.latency_ms, answer.kind) == (MISPLACED_MS, "exact")
    assert answer.notes == [note(file)] and answer.files == (str(file),)
    with pytest.raises(E.UnknownTableError) as raised:
        modperf.open(tmp_path, cache=False).query(**{**ASK, "backend": "trtllm", "version": "1.3.0rc10"})
    assert "the nccl table filed in that folder is read as a nccl release, and it is served as " \
           "b300_sxm/nccl/2.29.2" in str(raised.value)
    assert raised.value.fix.startswith("ask backend=nccl version=2.29.2")

    report = check(data_root=str(tmp_path))
    assert report.ok and report.failures == [] and report.rows == 1512
    (warning,) = report.warnings
    assert type(warning) is E.MisplacedTableError and warning.severity == "warning"
    assert warning.values == {"folder": "trtllm/1.3.0rc10", "recorded_versions": ["2.29.2"],
                              "belongs_in": "b300_sxm/comm/nccl/2.29.2", "served_as": "b300_sxm/nccl/2.29.2"}
    target = tmp_path / "b300_sxm" / "comm" / "nccl" / "2.29.2"
    assert warning.fix == f"move it where it belongs: mkdir -p {target} && mv {file} {target}/"
    strict = check(data_root=str(tmp_path), strict=True)
    assert not strict.ok and strict.failures == [*strict.files[0].warnings] and strict.warnings == []


def test_the_step_pricer_prices_from_it_and_says_where_it_lies(tmp_path: Path) -> None:
    """b300_sxm with its NCCL release folders taken away: the pricer's NCCL ops come from the
    misplaced file, served as 2.29.2, and the estimate's and the prediction's notes say where
    the file lies."""
    from modperf.model.estimate import estimate

    shutil.copytree(embedded_data_root() / "b300_sxm", tmp_path / "b300_sxm")
    shutil.rmtree(tmp_path / "b300_sxm" / "comm" / "nccl")
    db = modperf.open(tmp_path, cache=False)
    found = estimate(db, model="deepseek-ai/DeepSeek-V3", system="b300_sxm", backend="trtllm", tps=[8], isl=2048,
                     osl=512, batch=8, scope="model")
    file = tmp_path.joinpath(*FRAMEWORK, "nccl_perf.parquet")
    assert found.notes == [note(file)]
    (tp8,) = found.to_dict()["tps"]
    assert tp8["versions"]["nccl"] == "2.29.2"
    (gather,) = [op for op in tp8["decode_ops"] if op["table"] == "nccl"]
    assert (gather["name"], gather["backend"], gather["version"]) == ("logits all_gather", "nccl", "2.29.2")
    asked = db.query(table="nccl", system="b300_sxm", backend="nccl", version="2.29.2", **gather["fields"])
    assert gather["ms"] == asked.latency_ms and asked.notes == [note(file)]
    # a serving prediction priced with it says so too (the command a user runs)
    done = run_cli(["predict", "--model", "deepseek-ai/DeepSeek-V3", "--system", "b300_sxm", "--backend", "trtllm",
                    "--tp", "8", "--isl", "2048", "--osl", "512", "--batch", "8", "--data-root", str(tmp_path),
                    "--json"])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["notes"] == [note(file)]


def test_the_releases_own_file_answers_and_the_copy_is_compared(tmp_path: Path) -> None:
    """The embedded corpus's case, in a user's root: the release's folder holds its own file."""
    file = filed(tmp_path, FRAMEWORK)
    placed = filed(tmp_path, RELEASE, corpus_file(RELEASE))
    answer = modperf.open(tmp_path, cache=False).query(**ASK)
    assert (answer.latency_ms, answer.notes, answer.files) == (PLACED_MS, [], (str(placed),))
    report = check(data_root=str(tmp_path))
    assert report.ok and len(report.files) == 2 and report.rows == 1512 + 504
    (warning,) = report.warnings
    assert warning.values == {"folder": "trtllm/1.3.0rc10", "recorded_versions": ["2.29.2"],
                              "belongs_in": "b300_sxm/comm/nccl/2.29.2", "held_by": str(placed), "shared_keys": 504,
                              "keys_only_here": 0, "median_ratio": 0.998}
    assert warning.fix == f"keep one of the two: delete this one (rm {file}), or put it in place of the other " \
                          f"(mv {file} {placed})"
    assert not check(data_root=str(tmp_path), strict=True).ok
    # the file checked on its own finds the release's folder beside it
    (alone,) = check([str(file)]).warnings
    assert alone.values == warning.values


def test_keys_the_releases_file_lacks_are_a_failure(tmp_path: Path) -> None:
    """Not served, and some of its rows in no other file: they would be read nowhere."""
    file = filed(tmp_path, FRAMEWORK)
    whole = pq.read_table(corpus_file(RELEASE))
    filed(tmp_path, RELEASE, table=whole.filter(pc.not_equal(whole.column("num_gpus"), 8)))
    report = check(data_root=str(tmp_path))
    assert not report.ok and report.warnings == []
    (failure,) = report.failures
    assert type(failure) is E.MisplacedUnservedError and failure.kind == "misplaced_unserved"
    assert failure.file == str(file)
    assert (failure.values["shared_keys"], failure.values["keys_only_here"]) == (336, 168)
    assert "168 of its 504 keys are in no other file (read nowhere)" in failure.detail


def test_two_misplaced_files_claiming_one_release_are_not_chosen_between(tmp_path: Path) -> None:
    first = filed(tmp_path, FRAMEWORK)
    second = filed(tmp_path, ("b300_sxm", "comm", "sglang", "0.5.14"))
    catalog = Catalog.scan(tmp_path)
    assert catalog.slots == [] and [(r.path, r.misplaced.rivals) for r in catalog.files if r.misplaced] == [
        (second, (str(first),)), (first, (str(second),))]
    with pytest.raises(E.UnknownTableError, match="other misplaced files record the same release, so none is served"):
        modperf.open(tmp_path, cache=False).query(**{**ASK, "backend": "trtllm", "version": "1.3.0rc10"})
    report = check(data_root=str(tmp_path))
    assert [(f.kind, f.file, f.values["rivals"]) for f in report.failures] == [
        ("misplaced_unserved", str(second), [str(first)]), ("misplaced_unserved", str(first), [str(second)])]


def test_rows_recording_several_releases_cannot_be_served(tmp_path: Path) -> None:
    table = pq.read_table(corpus_file(FRAMEWORK))
    releases = pa.array(["2.29.2" if i % 2 else "2.27" for i in range(table.num_rows)])
    file = filed(tmp_path, FRAMEWORK, table=table.set_column(table.column_names.index("version"), "version", releases))
    (ref,) = Catalog.scan(tmp_path).slots  # a slot where it lies: asking it says why it cannot load
    assert ref.label == "b300_sxm/comm/trtllm/1.3.0rc10/nccl" and ref.misplaced.recorded == ("2.27", "2.29.2")
    report = check(data_root=str(tmp_path))
    (failure,) = report.failures
    assert type(failure) is E.MisplacedUnservedError and failure.file == str(file)
    assert "its rows record several releases (2.27, 2.29.2): no release's slot can serve it" in failure.detail
    with pytest.raises(E.TableRejectedError, match="misplaced_unserved"):
        modperf.open(tmp_path, cache=False).query(**{**ASK, "backend": "trtllm", "version": "1.3.0rc10"})


def test_the_caches_follow_where_it_is_served(tmp_path: Path, cache_dir: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan record and the query plans hold only while the misplaced file and the folders
    deciding where it is served are unchanged: its rows rewritten in place (no folder changes),
    then its release's folder given a file of its own."""
    monkeypatch.setattr(scan_cache, "RACY_NS", WINDOW_NS)
    root = tmp_path / "root"
    file = filed(root, FRAMEWORK)
    time.sleep(2 * WINDOW_NS / 1e9)

    def plan_answer(fields: dict) -> modperf.Answer | None:
        reader = modperf.open(root)
        assert reader._plans is not None
        return reader._plans.answer(fields, False)

    first = modperf.open(root).answer(ASK, quality=False)
    assert (first.latency_ms, first.notes) == (MISPLACED_MS, [note(file)])
    remembered = plan_answer(ASK)
    assert remembered is not None and (remembered.latency_ms, remembered.notes) == (MISPLACED_MS, [note(file)])
    assert modperf.open(root).catalog.watched[2]  # the record depends on the file it read

    # its rows now record 2.30, written in place: no folder of the data root changes
    table = pq.read_table(file)
    moved = table.set_column(table.column_names.index("version"), "version", pa.array(["2.30"] * table.num_rows))
    sink = pa.BufferOutputStream()
    pq.write_table(moved, sink)
    with open(file, "r+b") as handle:
        handle.truncate(0)
        handle.write(sink.getvalue().to_pybytes())
    assert plan_answer(ASK) is None
    assert [r.slot for r in scan_cache.scan(root).slots] == [("b300_sxm", "nccl", "2.30", "nccl")]
    with pytest.raises(E.UnknownTableError):
        modperf.open(root).answer(ASK, quality=False)
    later = modperf.open(root).answer({**ASK, "version": "2.30"}, quality=False)
    assert (later.latency_ms, later.notes) == (MISPLACED_MS, [note(file, "2.30")])

    # the release's folder gets its own file: it answers, the misplaced one is not served
    time.sleep(2 * WINDOW_NS / 1e9)
    modperf.open(root).answer({**ASK, "version": "2.30"}, quality=False)
    assert plan_answer({**ASK, "version": "2.30"}) is not None
    placed = filed(root, ("b300_sxm", "comm", "nccl", "2.30"), corpus_file(RELEASE))
    assert plan_answer({**ASK, "version": "2.30"}) is None
    now = modperf.open(root).answer({**ASK, "version": "2.30"}, quality=False)
    assert (now.latency_ms, now.notes, now.files) == (PLACED_MS, [], (str(placed),))


def test_a_scan_reads_the_release_without_pyarrow(tmp_path: Path) -> None:
    """The release comes from the footer's statistics (modperf.data.footer): a scan stays a listing."""
    filed(tmp_path, FRAMEWORK)
    code = ("import sys\nfrom modperf.data.catalog import Catalog\n"
            f"(ref,) = Catalog.scan({str(tmp_path)!r}).slots\n"
            "print(ref.slot, ref.misplaced.recorded, 'pyarrow' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "('b300_sxm', 'nccl', '2.29.2', 'nccl') ('2.29.2',) False"
