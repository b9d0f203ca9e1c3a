"""``modperf coverage`` on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from modperf.cli import app

runner = CliRunner()


def test_matrix_json_and_rich() -> None:
    result = runner.invoke(app, ["coverage", "--table", "mla_generation_module", "--system", "gb300", "--json"])
    assert result.exit_code == 0, result.output
    slots = json.loads(result.stdout)["slots"]
    assert [(s["backend"], s["version"], [n["native"] for n in s["natives"]]) for s in slots] == [
        ("trtllm", "1.3.0rc20", [128]), ("vllm", "0.24.0", [128]), ("vllm", "0.27.0", [96, 128])]
    result = runner.invoke(app, ["coverage", "--table", "mla_generation_module", "--system", "gb300"])
    assert result.exit_code == 0 and "coverage: native x tp" in result.stdout


def test_csv(fixtures: Path) -> None:
    result = runner.invoke(app, ["coverage", str(fixtures / "07_latent_collision" / "wheel" / "gb300"), "--csv",
                                 "--tp", "1,8"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("system,backend,version,table,family,tier,reused_from,native,models,tp,local")
    assert any(",96,moonshotai/Kimi-K3,8,12,True,True," in line for line in lines)


def test_model_and_diff() -> None:
    result = runner.invoke(app, ["coverage", "--model", "moonshotai/Kimi-K3", "--tp", "1,2,4,8",
                                 "--table", "mla_context_module", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["native"] == 96
    assert data["summary"]["slots_answering_every_tp"] == ["gb300/vllm/0.27.0/mla_context_module"]
    result = runner.invoke(app, ["coverage", "--diff", "0.24.0", "0.27.0", "--system", "gb300", "--backend", "vllm",
                                 "--table", "mla_context_module", "--json"])
    assert result.exit_code == 0, result.output
    (slot,) = json.loads(result.stdout)["slots"]
    assert slot["natives"]["96"]["gained"] == [1, 2, 3, 4, 6, 8, 12, 24, 48, 96]


@pytest.mark.parametrize("args", [
    ["--diff", "0.24.0", "0.27.0", "--model", "deepseek-ai/DeepSeek-V3"],
    ["--json", "--csv"],
    ["--model", "deepseek-ai/DeepSeek-V3", "--tp", "0"],
    ["--diff", "0.24.0", "0.0.0"],
    ["--diff", "0.24.0", "0.27.0", "--version", "0.24.0"],
    ["--table", "gemm"],
])
def test_usage_errors_exit_2(args: list[str]) -> None:
    assert runner.invoke(app, ["coverage", *args]).exit_code == 2


def test_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the [plot] extra (matplotlib) is not installed")
    png = tmp_path / "k3.png"
    result = runner.invoke(app, ["coverage", "--model", "moonshotai/Kimi-K3", "--table", "mla_generation_module",
                                 "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:4] == b"\x89PNG"
