import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from modperf.cli import app

runner = CliRunner()


def test_check_one_table_clean_json():
    result = runner.invoke(app, ["check", "--table", "mla_context_module", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["files_checked"] == 16 and report["failures"] == 0
    assert report["families"]["mla_module"]["natives"] == [96, 128]
    assert report["families"]["mla_module"]["rows"] == 107_467


def test_check_reports_failures_with_exit_1(fixtures: Path):
    stale = fixtures / "01_dsv4_stale_vs_migrated" / "stale_parent_eed87c1c9" / "gb200"
    result = runner.invoke(app, ["check", str(stale), "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    (fr,) = report["files"]
    (failure,) = fr["failures"]
    assert failure["type"] == "StaleConventionError" and failure["kind"] == "stale_convention"
    assert failure["row_count"] == 751 and failure["rows"] == [0, 1, 2, 3, 4]
    assert failure["values"] == {"model": "sgl-project/DeepSeek-V4-Flash-FP8", "num_heads": 64,
                                 "tp_sizes": [1, 2, 4, 8]}


def test_check_human_output_lists_failures(fixtures: Path):
    legacy = fixtures / "03_legacy_no_num_heads"
    result = runner.invoke(app, ["check", str(legacy)], env={"COLUMNS": "300"})
    assert result.exit_code == 1
    assert "FAIL missing_column:" in result.stdout
    assert "[table='context_mla', column='num_heads']" in result.stdout  # values survive rich markup
    assert "2 tables, 0 rows checked" in result.stdout and "4 failure(s)" in result.stdout


def test_usage_errors_exit_2_without_traceback(tmp_path: Path):
    for args in (["check", "--table", "no_such_table"], ["check", "--data-root", str(tmp_path / "nope")],
                 ["check", str(tmp_path / "missing_perf.parquet")]):
        proc = subprocess.run([sys.executable, "-m", "modperf", *args], capture_output=True, text=True)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stderr.startswith("error (")
    proc = subprocess.run([sys.executable, "-m", "modperf", "check", "--bogus"], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_usage_error_as_json():
    result = runner.invoke(app, ["check", "--table", "no_such_table", "--json"])
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"]["type"] == "UnknownTableError"
