"""``modperf migrate`` end to end: plans and writes through the CLI, JSON output, exit codes
0/1/2, typed messages and never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tests.helpers import CSA_CTX, TWIN_DIR, snapshot
from typer.testing import CliRunner

from modperf.base.atomic import temp_files
from modperf.cli import app

runner = CliRunner()




def run(*args: str):
    result = runner.invoke(app, ["migrate", *args])
    assert "Traceback" not in result.stdout + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result




def test_dry_run_prints_the_plan_and_writes_nothing(stale: Path) -> None:
    before = snapshot(stale)
    result = run(str(stale))
    assert result.exit_code == 0
    out = result.stdout
    assert out.count("stale_native") == 5 and "64 -> 64,32,16,8" in out and "128 -> 128,64,32,16" in out
    assert "dry run: 5 file(s): 5 to migrate (4,135 rows change)" in out and "--execute" in out
    assert snapshot(stale) == before


def test_execute_writes_what_check_accepts_and_the_twins_hold(stale: Path, fixtures: Path) -> None:
    result = run(str(stale), "--execute")
    assert result.exit_code == 0, result.stdout
    assert "wrote 5" in result.stdout and "modperf_check ok" in result.stdout
    check = runner.invoke(app, ["check", str(stale)])
    assert check.exit_code == 0, check.stdout
    for twin in (fixtures / TWIN_DIR).rglob("*_perf.parquet"):
        assert pq.read_table(stale / twin.relative_to(fixtures / TWIN_DIR)).equals(pq.read_table(twin))


def test_json_plan(stale: Path) -> None:
    result = run(str(stale / CSA_CTX), "--json")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert doc["ok"] is True and doc["executed"] is False
    assert doc["summary"] == {"files": 1, "to_write": 1, "written": 0, "unchanged": 0, "refused": 0,
                              "rows_changed": 574}
    (plan,) = doc["files"]
    assert (plan["pattern"], plan["action"], plan["rows"], plan["table"]) == ("stale_native", "rewrite", 765,
                                                                             "dsv4_csa_context_module")
    pro = [g for g in plan["groups"] if g["model"] == "deepseek-ai/DeepSeek-V4-Pro"][0]
    assert pro["num_heads_after"] == {"1": 128, "2": 64, "4": 32, "8": 16} and pro["native"] == 128


def test_legacy_needs_model_exit_2(legacy: Path) -> None:
    result = run(str(legacy))
    assert result.exit_code == 2
    assert "model_required" in result.stdout and "--model MODEL_ID" in result.stdout
    assert "nothing was written" in result.stdout
    doc = json.loads(run(str(legacy), "--json").stdout)
    assert [f["refusals"][0]["type"] for f in doc["files"]] == ["ModelRequiredError"] * 2


def test_legacy_with_model_and_out(legacy: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run(str(legacy), "--model", "deepseek-ai/DeepSeek-V3", "--out", str(out), "--execute", "--json")
    assert result.exit_code == 0, result.stdout
    doc = json.loads(result.stdout)
    assert doc["summary"]["written"] == 2 and doc["summary"]["rows_changed"] == 1218 + 2534
    assert {f["filled"]["kernel_source"]["value"] for f in doc["files"]} == {"default"}
    assert sorted(p.name for p in out.iterdir()) == ["context_mla_perf.parquet", "generation_mla_perf.parquet"]
    assert not (legacy / "context_mla_perf.parquet").exists()
    assert runner.invoke(app, ["check", str(out)]).exit_code == 0
    again = run(str(legacy), "--model", "deepseek-ai/DeepSeek-V3", "--out", str(out))
    assert again.exit_code == 0 and again.stdout.count("already migrated") == 2
    (out / "context_mla_perf.parquet").write_bytes(b"not this migration")
    clash = run(str(legacy / "context_mla_perf.txt"), "--model", "deepseek-ai/DeepSeek-V3", "--out", str(out))
    assert clash.exit_code == 2 and "target_exists" in clash.stdout


def test_unknown_model_is_a_typed_message(legacy: Path) -> None:
    result = run(str(legacy), "--model", "acme/Nope")
    assert result.exit_code == 2  # a model the user named: a usage error
    assert "error (unknown_model): no HF config for model 'acme/Nope'" in result.stderr
    assert "acme--Nope_config.json" in result.stderr
    doc = json.loads(run(str(legacy), "--model", "acme/Nope", "--json").stdout)
    assert doc["error"]["type"] == "UnknownModelError"


def test_usage_errors_exit_2(stale: Path) -> None:
    assert run(str(stale / "missing")).exit_code == 2
    result = run(str(stale), "--fill", "kernel_source")
    assert result.exit_code == 2 and "--fill expects COLUMN=VALUE" in result.stderr


def test_truncated_file_is_reported_not_raised(stale: Path) -> None:
    path = stale / CSA_CTX
    path.write_bytes(path.read_bytes()[:5000])
    result = run(str(path), "--execute")
    assert result.exit_code == 1 and "unreadable" in result.stdout and "truncated" in result.stdout


def test_write_failing_midway(stale: Path, monkeypatch) -> None:
    before = snapshot(stale)

    def disk_full(table, where, **kwargs):
        where.write(b"PAR1" + b"\0" * 2048)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", disk_full)
    result = run(str(stale), "--execute")
    assert result.exit_code == 1 and "write_failed" in result.stdout and "No space left on device" in result.stdout
    assert snapshot(stale) == before
    assert all(temp_files(p.parent) == [] for p in stale.rglob("*_perf.parquet"))


def test_console_script(stale: Path) -> None:
    """The installed entry point, as a user runs it."""
    exe = Path(sys.executable).with_name("modperf")
    if not exe.exists():
        pytest.skip("console script not installed next to the interpreter")
    done = subprocess.run([str(exe), "migrate", str(stale / CSA_CTX), "--json"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["summary"]["rows_changed"] == 574
