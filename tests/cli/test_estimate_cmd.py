import json

from typer.testing import CliRunner

from modperf.cli import app

runner = CliRunner()
KIMI = ["estimate", "--model", "moonshotai/Kimi-K3", "--system", "gb300", "--backend", "vllm", "--isl", "2048",
        "--osl", "128", "--batch", "4", "--scope", "attention"]


def test_estimate_table(db):
    result = runner.invoke(app, [*KIMI, "--tp", "1,2,4,8"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    for col in ("tp=1", "tp=2", "tp=4", "tp=8"):
        assert col in out
    assert "MLA x24 prefill" in out and "decode step (kv 2112)" in out and "prefill layer queries" in out
    assert "not included: 69 KDA linear attention layer(s)" in out
    assert "versions: mla_context_module 0.27.0, mla_generation_module 0.27.0" in out


def test_estimate_json_and_kernel_pin(db):
    result = runner.invoke(app, [*KIMI, "--tp", "8", "--kernel-source", "mla_context_module=FLASH_ATTN", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (tp,) = doc["tps"]
    assert tp["tp"] == 8 and tp["local_heads"] == 12
    attention = tp["prefill_layers"][0]["components"][0]
    assert attention["kernel_source"] == "FLASH_ATTN" and attention["native"] == 96
    direct = db.query(table="mla_context_module", system="gb300", backend="vllm", version="0.27.0",
                      model="moonshotai/Kimi-K3", tp_size=8, batch_size=4, isl=2048, kernel_source="FLASH_ATTN",
                      mla_dtype="bfloat16", kv_cache_dtype="bfloat16", gemm_type="bfloat16")
    assert tp["prefill_ms"] == 24 * direct.latency_ms


def test_estimate_errors_exit_2_with_a_message():
    result = runner.invoke(app, [*KIMI, "--tp", "1,5"])
    assert result.exit_code == 2
    assert "error (shard): tp=5 does not divide the native head count 96" in result.stderr
    result = runner.invoke(app, [*KIMI, "--tp", "one"])
    assert result.exit_code == 2
    assert "error (option_value): --tp takes positive integers separated by commas (each in 1..4,096) [tp='one']" \
        in result.stderr
    result = runner.invoke(app, [*KIMI, "--kernel-source", "FLASH_ATTN", "--json"])
    assert result.exit_code == 2 and json.loads(result.stdout)["error"]["kind"] == "usage"


def test_missing_native_exit_1_then_substitute():
    args = ["estimate", "--model", "moonshotai/Kimi-K2-Instruct", "--system", "h200_sxm", "--backend", "vllm",
            "--isl", "1024", "--osl", "64", "--batch", "2", "--tp", "8", "--scope", "attention"]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 1 and "error (not_covered)" in refused.stderr
    allowed = runner.invoke(app, [*args, "--allow-substitute"], env={"COLUMNS": "250"})
    assert allowed.exit_code == 0
    assert "substitution tp=8: native 64 is not measured in this table; answered from the nearest native bucket, 128" \
        in allowed.stdout


def test_a_phase_out_of_coverage_prints_the_rest_and_exits_1():
    args = ["estimate", "--model", "Qwen/Qwen3-32B", "--system", "h200_sxm", "--backend", "vllm", "--isl", "4095",
            "--osl", "512", "--batch", "64", "--tp", "1,2", "--scope", "attention"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "not covered" in result.stdout and "decode step (kv 4351)" in result.stdout
    doc = json.loads(runner.invoke(app, [*args, "--json", "--decode-kv", "1024"]).stdout)
    assert doc["decode_kv"] == 1024 and doc["tps"][1]["decode_ms"] > 0 and doc["tps"][1]["prefill_ms"] is None


V3 = ["estimate", "--model", "deepseek-ai/DeepSeek-V3", "--system", "h200_sxm", "--backend", "vllm", "--isl", "1024",
      "--osl", "256", "--batch", "4"]


def test_scope_model_is_the_default_one_column_per_tp(db):
    result = runner.invoke(app, [*V3, "--tp", "4,8"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "whole model per prefill and per decode step" in out and "tp=4" in out and "tp=8" in out
    for row in ("prefill attention", "prefill gemm", "prefill moe", "prefill communication", "prefill other",
                "decode moe", "decode step (kv 1152)"):
        assert row in out
    assert "versions: custom_allreduce 0.24.0, gemm 0.24.0" in out


def test_scope_model_json_fields(db):
    result = runner.invoke(app, [*V3, "--tp", "8", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (tp,) = doc["tps"]
    assert doc["scope"] == "model" and tp["tp"] == 8 and tp["parallel"] == {"tp": 8, "moe_tp": 8, "moe_ep": 1,
                                                                          "attention_dp": 1}
    for phase in ("prefill", "decode"):
        comps = tp[f"{phase}_components"]
        assert list(comps) == ["attention", "gemm", "moe", "communication", "other"]
        assert abs(sum(comps.values()) - tp[f"{phase}_ms"]) < 1e-9
        ops = tp[f"{phase}_ops"]
        assert abs(sum(op["ms"] * op["count"] for op in ops) - tp[f"{phase}_ms"]) < 1e-9
        assert {"name", "table", "version", "kind", "ms", "count", "fields", "reason"} <= set(ops[0])
    experts = next(op for op in tp["decode_ops"] if op["name"] == "L3-60 moe experts")
    assert experts["fields"]["num_tokens"] == 4 and experts["table"] == "moe"


def test_scope_model_splits_past_the_grid_and_partial_exits_1(db):
    """Batch 4 x isl 4096 on 8 attention-DP ranks sends 131,072 tokens to the experts, past
    what the grid answers: priced as 4 parts of 32,768 (the tokens of batch 1 on 8 ranks)."""
    args = [*[a if a != "1024" else "4096" for a in V3], "--tp", "1", "--attention-dp", "8", "--moe-ep", "8", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    (tp,) = json.loads(result.stdout)["tps"]
    assert tp["parallel"] == {"tp": 1, "moe_tp": 1, "moe_ep": 8, "attention_dp": 8}
    experts = next(op for op in tp["prefill_ops"] if op["name"] == "L3-60 moe experts")
    assert experts["fields"]["split"] == "4 x num_tokens" and experts["fields"]["num_tokens"] == 131072
    one = runner.invoke(app, [*[a if a != "4" else "1" for a in args[:-7]], "--tp", "1", "--attention-dp", "8",
                              "--moe-ep", "8", "--json"])
    (tp1,) = json.loads(one.stdout)["tps"]
    part = next(op for op in tp1["prefill_ops"] if op["name"] == "L3-60 moe experts")
    assert part["fields"]["num_tokens"] == 32768 and "split" not in part["fields"]
    assert experts["ms"] == 4 * part["ms"]
    # Kimi-K2.5's 64 heads: the MLA module tables hold native 128 only, and vllm has no MLA kernel
    # tables to compose it from: partial, exit 1, the reason named
    kimi = runner.invoke(app, ["estimate", "--model", "moonshotai/Kimi-K2.5", "--system", "h200_sxm", "--backend",
                               "vllm", "--tp", "8", "--isl", "1024", "--osl", "128", "--batch", "4", "--json"])
    assert kimi.exit_code == 1
    (tpk,) = json.loads(kimi.stdout)["tps"]
    assert tpk["prefill_ms"] is None and tpk["prefill_not_covered"][0]["name"] == "L0-60 mla attention (prefill)"
    assert "has no native-64 bucket" in tpk["prefill_not_covered"][0]["reason"]
    bad = runner.invoke(app, [*V3, "--tp", "8", "--moe-tp", "4"])
    assert bad.exit_code == 2 and "error (option_value): moe_tp x moe_ep = 4 must equal tp x attention_dp = 8" \
        in bad.stderr
    mixed = runner.invoke(app, [*V3, "--scope", "attention", "--moe-ep", "8"])
    assert mixed.exit_code == 2 and "apply to scope model only" in mixed.stderr
    pinned = runner.invoke(app, [*V3, "--kernel-source", "gemm=x"])
    assert pinned.exit_code == 2 and "kernel_sources apply to scope attention only" in pinned.stderr
