import json

import pytest
from typer.testing import CliRunner

from modperf.cli import app
from modperf.serving.predict import deployment_from_row, predict

runner = CliRunner()
QWEN = ["predict", "--model", "Qwen/Qwen3-32B", "--system", "h200_sxm", "--backend", "vllm", "--isl", "1024",
        "--osl", "128", "--batch", "8", "--tp", "2"]
ROW = {"id": "r1", "model_path": "Qwen/Qwen3-32B", "system": "h200_sxm", "backend": "vllm", "mode": "agg",
       "isl": 1024, "osl": 128, "batch_size": 8, "tp_size": 2}


def test_one_deployment_from_flags(db):
    result = runner.invoke(app, [*QWEN, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    expected = predict(db, deployment_from_row({k: v for k, v in ROW.items() if k != "id"}))
    assert doc["ttft_ms"] == expected.ttft_ms and doc["tpot_ms"] == expected.tpot_ms
    assert set(doc) >= {"id", "ttft_ms", "tpot_ms", "tokens_per_s_per_user", "tokens_per_s_per_gpu", "steps",
                        "serving", "provenance"}
    text = runner.invoke(app, QWEN)
    assert text.exit_code == 0
    assert "TTFT ms" in text.stdout and "TPOT ms" in text.stdout and "versions: " in text.stdout


def test_batch_lines_in_order_with_typed_error_lines(db, tmp_path):
    lines = [ROW, {**ROW, "id": "r2", "system": "h200"}, {**ROW, "id": "r3", "batch_size": -1},
             {**ROW, "id": "r4", "tp_size": 3}, "not json", {**ROW, "id": "r5", "isl": 2048}]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    result = runner.invoke(app, ["predict", "--batch", str(path)])
    assert result.exit_code == 1  # some lines failed; every line answered
    out = [json.loads(line) for line in result.stdout.splitlines()]
    assert [o["id"] for o in out] == ["r1", "r2", "r3", "r4", None, "r5"]
    assert out[0]["ttft_ms"] > 0 and out[5]["ttft_ms"] > out[0]["ttft_ms"]
    assert [o.get("error", {}).get("type") for o in out] == [None, "UnknownTableError", "QueryFieldError",
                                                             "ShardError", "QueryFieldError", None]
    assert out[2]["error"]["message"].startswith("batch_size must be an integer in 1..1,048,576")
    assert out[4]["error"]["message"].startswith("line 5 is not JSON")
    # stdin works the same
    piped = runner.invoke(app, ["predict", "--batch", "-"], input=json.dumps(ROW) + "\n")
    assert piped.exit_code == 0 and json.loads(piped.stdout)["id"] == "r1"


def test_usage_errors_exit_2(db):
    missing = runner.invoke(app, ["predict", "--model", "Qwen/Qwen3-32B", "--json"])
    assert missing.exit_code == 2
    assert json.loads(missing.stdout)["error"]["message"].startswith("missing --system, --backend, --isl, --osl")
    shard = runner.invoke(app, [*QWEN[:-1], "3"])
    assert shard.exit_code == 2 and "tp=3 does not divide" in shard.stderr


def test_percentiles_as_a_user_runs_them(db, monkeypatch):
    """``predict --percentiles --json`` in a child process at 80 columns: the simulation's
    p50 / p90 / p99 beside the closed form's answer, the library's values exactly; one user
    physics only prefills alone, so every TTFT is step_cost's prefill step."""
    from helpers import run_cli
    from modperf.model.step import Parallel, SeqChunk, step_cost
    from modperf.serving.percentiles import percentiles

    monkeypatch.setenv("COLUMNS", "80")
    args = [*QWEN[:-3], "1", "--tp", "2", "--percentiles", "--physics-only"]
    proc = run_cli([*args, "--json"])
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    dep = deployment_from_row({**{k: v for k, v in ROW.items() if k != "id"}, "batch_size": 1})
    expected = percentiles(db, dep, fitted=False)
    assert doc["percentiles"]["ttft_ms"] == expected["ttft_ms"] and doc["percentiles"]["tpot_ms"] == expected["tpot_ms"]
    p1 = step_cost(db, model="Qwen/Qwen3-32B", system="h200_sxm", backend="vllm", parallel=Parallel(tp=2),
                   prefill=SeqChunk(1, 1024)).total_ms
    assert doc["percentiles"]["ttft_ms"]["p99"] == pytest.approx(p1, rel=1e-9)
    assert doc["percentiles"]["loop"] == "closed" and doc["percentiles"]["concurrency"] == 1
    assert doc["ttft_ms"] == predict(db, dep, fitted=False).ttft_ms  # the closed form's answer is unchanged
    text = run_cli(args)
    assert text.returncode == 0, text.stderr
    assert "simulated: closed loop, concurrency 1" in text.stdout and "p99" in text.stdout
    assert f"{p1:.1f}" in text.stdout


def test_percentiles_open_loop_and_refusals(db):
    result = runner.invoke(app, [*QWEN, "--percentiles", "--request-rate", "2", "--seed", "3", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)["percentiles"]
    assert doc["loop"] == "open" and doc["request_rate_per_s"] == 2.0 and doc["seed"] == 3
    assert doc["ttft_ms"]["p50"] <= doc["ttft_ms"]["p90"] <= doc["ttft_ms"]["p99"]
    alone = runner.invoke(app, [*QWEN, "--request-rate", "2", "--json"])
    assert alone.exit_code == 2
    assert json.loads(alone.stdout)["error"]["message"].startswith("--request-rate shape(s) the simulation")
    seeded = runner.invoke(app, [*QWEN, "--percentiles", "--physics-only", "--seed", "3", "--json"])
    assert seeded.exit_code == 2
    assert json.loads(seeded.stdout)["error"]["message"].startswith("a seed changes nothing here")
    disagg = runner.invoke(app, ["predict", "--model", "Qwen/Qwen3-32B", "--system", "h200_sxm", "--backend", "vllm",
                                 "--isl", "1024", "--osl", "128", "--mode", "disagg", "--prefill-tp", "2",
                                 "--prefill-workers", "1", "--decode-tp", "2", "--decode-workers", "1",
                                 "--decode-batch", "8", "--percentiles", "--json"])
    assert disagg.exit_code == 2 and "aggregated deployments only" in json.loads(disagg.stdout)["error"]["message"]


def test_percentiles_on_batch_lines(db, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + json.dumps({**ROW, "id": "r2", "pp_size": 2}) + "\n")
    result = runner.invoke(app, ["predict", "--batch", str(path), "--percentiles"])
    assert result.exit_code == 1
    first, second = (json.loads(line) for line in result.stdout.splitlines())
    assert first["id"] == "r1" and first["percentiles"]["concurrency"] == 8
    assert second["error"]["type"] == "OptionValueError" and "one pipeline stage" in second["error"]["message"]
