"""``modperf dedupe`` on the command line."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from modperf.cli import app

runner = CliRunner()


def test_dedupe_json_on_the_alias_fixture(fixtures: Path) -> None:
    result = runner.invoke(app, ["dedupe", str(fixtures / "02_alias_duplication"), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is True and data["tolerance"] == 0.1
    assert data["totals"]["duplicate_rows"] == 31316 and data["totals"]["alias_duplicate_rows"] == 31316
    by_table = {f["table"]: f for f in data["files"]}
    group = by_table["mla_context_module"]["alias_groups"][0]
    assert group["canonical"] == "deepseek-ai/DeepSeek-R1" and group["spread"]["over_tolerance"] == 155
    assert round(group["spread"]["median_rel_diff"], 6) == 0.002567


def test_dedupe_write_then_check(fixtures: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(app, ["dedupe", str(fixtures / "02_alias_duplication"), "--write", str(out),
                                 "--prefer", "deepseek-ai/DeepSeek-V3", "--tolerance", "0.2"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())  # rich wraps at the test terminal's width
    assert "written to" in text and "identities spread over 20.00%" in text
    check = runner.invoke(app, ["check", str(out), "--json"])
    assert check.exit_code == 0, check.output
    assert json.loads(check.stdout)["rows"] == 3886 + 5888 + 11776


def test_dedupe_usage_errors(fixtures: Path) -> None:
    result = runner.invoke(app, ["dedupe", "--table", "gemm", "--json"])
    assert result.exit_code == 2 and json.loads(result.stdout)["error"]["kind"] == "unknown_table"
    result = runner.invoke(app, ["dedupe", str(fixtures / "02_alias_duplication"), "--tolerance", "-1"])
    assert result.exit_code == 2


def test_dedupe_exits_1_when_a_table_does_not_load(fixtures: Path) -> None:
    result = runner.invoke(app, ["dedupe", str(fixtures / "03_legacy_no_num_heads"), "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["files"][0]["failures"][0]["kind"] == "missing_column"
