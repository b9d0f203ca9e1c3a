"""``modperf check`` as a user runs it (a child process, COLUMNS=80, not a terminal): failures
exit 1, warnings are listed with their fix and exit 0, ``--strict`` fails on warnings too.
The embedded corpus checks clean with its one warning, and a user's data root holding the same
misplaced file behaves the same (issue 21)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from tests.helpers import run_cli, strict_json

from modperf.fast.cache_keys import embedded_data_root

MISPLACED = ("b300_sxm", "comm", "trtllm", "1.3.0rc10", "nccl_perf.parquet")
PLACED = ("b300_sxm", "comm", "nccl", "2.29.2", "nccl_perf.parquet")


@pytest.fixture(autouse=True)
def eighty_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


def run(argv: list[str]):
    return run_cli(argv, timeout=300)


def words(text: str) -> str:
    """The text with every run of white space as one space (however a terminal wraps it)."""
    return " ".join(text.split())


def test_the_embedded_corpus_checks_clean_with_one_warning() -> None:
    misplaced, placed = embedded_data_root().joinpath(*MISPLACED), embedded_data_root().joinpath(*PLACED)
    done = run(["check"])
    assert done.returncode == 0, done.stderr
    text = words(done.stdout)
    assert "FAIL" not in text
    assert re.search(r" 736 tables, 12,586,413 rows checked in \d+\.\d s: clean, 1 warning$", text)
    assert (f"WARN misplaced_table: {misplaced} nccl table filed in the trtllm framework folder "
            "b300_sxm/comm/trtllm/1.3.0rc10/: its rows record release 2.29.2, whose own file answers that release: "
            "this file is not served (it re-measures 504 of that file's keys and holds none that file lacks; median "
            "latency ratio, this file to that one: 0.998)") in text
    assert f"Fix: keep one of the two: delete this one (rm {misplaced}), or put it in place of the other " \
           f"(mv {misplaced} {placed})" in text

    strict = run(["check", "--strict"])
    assert strict.returncode == 1
    text = words(strict.stdout)
    assert f"FAIL misplaced_table (a warning; --strict): {misplaced} " in text and "WARN" not in text
    assert text.endswith(": 1 failure(s) (1 warning failed by --strict)")


def test_json_counts_failures_and_warnings_apart() -> None:
    done = run(["check", "--table", "nccl", "--json"])
    assert done.returncode == 0, done.stderr
    report = strict_json(done.stdout)
    assert (report["ok"], report["strict"], report["failures"], report["warnings"], report["files_failed"]) == \
        (True, False, 0, 1, 0)
    assert report["families"]["collective"]["warnings"] == 1 and report["families"]["collective"]["failures"] == 0
    (noted,) = [f for f in report["files"] if f["warnings"]]
    assert (noted["system"], noted["backend"], noted["version"], noted["ok"], noted["failures"]) == \
        ("b300_sxm", "trtllm", "1.3.0rc10", True, [])
    (warning,) = noted["warnings"]
    assert (warning["type"], warning["kind"]) == ("MisplacedTableError", "misplaced_table")
    assert warning["values"]["held_by"] == str(embedded_data_root().joinpath(*PLACED))
    assert noted["misplaced"]["served_as"] is None and noted["misplaced"]["recorded_versions"] == ["2.29.2"]

    strict = run(["check", "--table", "nccl", "--json", "--strict"])
    assert strict.returncode == 1
    report = strict_json(strict.stdout)
    assert (report["ok"], report["strict"], report["failures"], report["warnings"], report["files_failed"]) == \
        (False, True, 1, 0, 1)


def test_a_users_root_with_the_misplaced_file_behaves_the_same(tmp_path: Path) -> None:
    """The real file, alone in a user's data root: served as its release (nothing else claims
    it), the query's answer is the file's and says where it lies; check warns, --strict fails."""
    file = tmp_path.joinpath(*MISPLACED)
    file.parent.mkdir(parents=True)
    shutil.copyfile(embedded_data_root().joinpath(*MISPLACED), file)
    done = run(["check", "--data-root", str(tmp_path)])
    assert done.returncode == 0, done.stderr
    text = words(done.stdout)
    target = tmp_path / "b300_sxm" / "comm" / "nccl" / "2.29.2"
    assert (f"WARN misplaced_table: {file} nccl table filed in the trtllm framework folder "
            "b300_sxm/comm/trtllm/1.3.0rc10/: its rows record release 2.29.2, so it is served as b300_sxm/nccl/2.29.2 "
            "(every answer from it names this file)") in text
    assert f"Fix: move it where it belongs: mkdir -p {target} && mv {file} {target}/" in text
    assert re.search(r" 1 tables, 1,512 rows checked in \d+\.\d s: clean, 1 warning$", text)
    assert run(["check", "--data-root", str(tmp_path), "--strict"]).returncode == 1
    # the file named alone (a collector's output) is judged the same way
    alone = run(["check", str(file)])
    assert alone.returncode == 0 and words(alone.stdout).endswith(": clean, 1 warning")

    ask = ["query", "nccl", "--data-root", str(tmp_path), "--system", "b300_sxm", "--backend", "nccl", "--version",
           "2.29.2", "--op-name", "all_reduce", "--nccl-dtype", "half", "--num-gpus", "8", "--message-size",
           "16777216"]
    answer = run(ask)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.splitlines()[0].split() == ["0.1682", "ms", "exact"]
    assert (f"served from {file}, filed in the framework folder b300_sxm/comm/trtllm/1.3.0rc10/: read as nccl release "
            "2.29.2 (the release its rows record); it belongs in b300_sxm/comm/nccl/2.29.2/") in words(answer.stdout)
    as_json = json.loads(run([*ask, "--json"]).stdout)
    assert (as_json["latency_ms"], as_json["kind"], as_json["files"]) == (0.1682, "exact", [str(file)])
    assert as_json["notes"] == [f"served from {file}, filed in the framework folder b300_sxm/comm/trtllm/1.3.0rc10/: "
                                "read as nccl release 2.29.2 (the release its rows record); it belongs in "
                                "b300_sxm/comm/nccl/2.29.2/"]
