"""``modperf check``'s findings as a user acts on them (issue 25): a file named twice is checked
once, and the fix of a stale table is a command that works when run as printed (a child
process, COLUMNS=80, not a terminal; on copies of ../shared fixtures)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.helpers import LEGACY_DIR, STALE_DIR, run_cli, writable_copy


@pytest.fixture(autouse=True)
def eighty_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


def test_a_file_named_and_inside_a_named_folder_is_checked_once(fixtures: Path) -> None:
    folder = fixtures / STALE_DIR / "gb200"
    (file,) = folder.rglob("*_perf.parquet")
    for argv in ([str(file), str(folder)], [str(folder), str(file)], [str(folder), str(folder) + "/"]):
        done = run_cli(["check", *argv, "--json"])
        assert done.returncode == 1, done.stderr
        report = json.loads(done.stdout)
        assert (report["files_checked"], report["files_failed"], report["failures"], report["rows"]) == (1, 1, 1, 0)
    human = run_cli(["check", str(file), str(folder)])
    assert human.returncode == 1 and " ".join(human.stdout.split()).endswith(": 1 failure(s)")
    assert "1 tables, 0 rows checked in " in " ".join(human.stdout.split())


def fix_command(text: str) -> list[str]:
    """The command a fix names (between backticks), as argv."""
    found = re.search(r"`(modperf [^`]+)`", text)
    assert found, text
    return shlex.split(found.group(1))[1:]


def test_a_stale_table_without_a_model_column_is_fixed_by_the_command_its_fix_names(fixtures: Path,
                                                                                    tmp_path: Path) -> None:
    """An MLA kernel table (no model column) stored the retired way, num_heads = 128 at every
    tp: migrate takes the native from --model, so the fix names it, with a model of the
    kernel's dims; run as printed (then with --execute), it gives back the rank-local table."""
    legacy = writable_copy(fixtures / LEGACY_DIR, tmp_path / "legacy")
    written = run_cli(["migrate", str(legacy / "context_mla_perf.txt"), "--model", "deepseek-ai/DeepSeek-V3",
                       "--execute"])
    assert written.returncode == 0, written.stderr
    rank_local = pq.read_table(legacy / "context_mla_perf.parquet")
    stale = tmp_path / "h200_sxm" / "mla" / "trtllm" / "0.20.0" / "context_mla_perf.parquet"
    stale.parent.mkdir(parents=True)
    heads = rank_local.schema.get_field_index("num_heads")
    pq.write_table(rank_local.set_column(heads, rank_local.schema.field(heads),
                                         pa.array([128] * rank_local.num_rows)), stale)

    checked = run_cli(["check", str(stale), "--json"])
    assert checked.returncode == 1
    (failure,) = json.loads(checked.stdout)["files"][0]["failures"]
    assert failure["kind"] == "stale_convention"
    assert failure["values"] == {"model": None, "num_heads": 128, "tp_sizes": [1, 2, 4, 8, 16, 32, 64]}
    assert failure["fix"] == (
        f"run `modperf migrate {stale} --model deepseek-ai/DeepSeek-R1` (a dry run: it prints the plan; add --execute "
        "to rewrite the file); the table has no model column, and any model with 128 attention heads and the dims "
        "the kernel was collected at gives the same rewrite: num_heads becomes native // tp_size")
    argv = fix_command(failure["fix"])
    assert argv == ["migrate", str(stale), "--model", "deepseek-ai/DeepSeek-R1"]
    # without --model, as the fix used to read, migrate refuses: the native is unknown
    refused = run_cli(argv[:2])
    assert refused.returncode == 2 and "REFUSED model_required" in refused.stdout
    dry = run_cli(argv)
    assert dry.returncode == 0, dry.stderr
    assert pq.read_table(stale).column("num_heads").to_pylist() == [128] * rank_local.num_rows  # a dry run
    done = run_cli([*argv, "--execute"])
    assert done.returncode == 0, done.stderr
    assert pq.read_table(stale).equals(rank_local)
    again = run_cli(["check", str(stale)])
    assert again.returncode == 0 and " ".join(again.stdout.split()).endswith(": clean")


def test_a_stale_table_with_a_model_column_needs_no_model(fixtures: Path, tmp_path: Path) -> None:
    stale = writable_copy(fixtures / STALE_DIR / "gb200", tmp_path / "gb200")
    (file,) = stale.rglob("*_perf.parquet")
    (failure,) = json.loads(run_cli(["check", str(file), "--json"]).stdout)["files"][0]["failures"]
    argv = fix_command(failure["fix"])
    assert argv == ["migrate", str(file)]
    assert run_cli([*argv, "--execute"]).returncode == 0
    assert run_cli(["check", str(file)]).returncode == 0
