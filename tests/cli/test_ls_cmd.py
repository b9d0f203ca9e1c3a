import json

from typer.testing import CliRunner

from modperf.cli import app

runner = CliRunner()


def test_ls_json_lists_models_and_head_pairs():
    result = runner.invoke(app, ["ls", "--system", "gb300", "--backend", "vllm", "--version", "0.27.0",
                                 "--table", "mla_context_module", "--json"])
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.stdout)["tables"]
    assert entry["rows"] == 21_860 and entry["family"] == "mla_module"
    assert entry["models"] == ["deepseek-ai/DeepSeek-V3", "moonshotai/Kimi-K3"]
    assert entry["head_pairs_by_model"]["moonshotai/Kimi-K3"] == [
        "1x1", "2x1", "4x1", "8x1", "12x1", "16x1", "24x1", "32x1", "48x1", "64x1", "96x1", "128x1"]


def test_ls_shows_reuse_and_shadowed_files():
    result = runner.invoke(app, ["ls", "--system", "b200_sxm", "--backend", "vllm", "--version", "0.22.0", "--json"])
    entries = json.loads(result.stdout)["tables"]
    attention = [(e["table"], e["reused_from"], e["shadowed_by_reuse"]) for e in entries
                 if e["table"] == "context_attention"]
    assert attention == [("context_attention", "0.24.0", False), ("context_attention", None, True)]


def test_ls_table_output():
    result = runner.invoke(app, ["ls", "--system", "h200_sxm", "--table", "context_mla"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "1x64 2x32 4x16 8x8 16x4 32x2 64x1 128x1" in result.stdout
