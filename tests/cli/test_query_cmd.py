"""``modperf query``: one query, --json, errors without tracebacks, and --batch JSON lines."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from modperf.cli import app
from modperf.cli._batch import batch_path, run_alone

runner = CliRunner()
SLOT = ["mla_context_module", "--system", "gb300", "--backend", "vllm", "--version", "0.27.0"]
KEY = ["--kernel-source", "FLASH_ATTN", "--mla-dtype", "bfloat16", "--kv-cache-dtype", "bfloat16",
       "--gemm-type", "bfloat16", "--batch-size", "4", "--isl", "2048"]
LINE = {"table": "mla_context_module", "system": "gb300", "backend": "vllm", "version": "0.27.0",
        "kernel_source": "FLASH_ATTN", "mla_dtype": "bfloat16", "kv_cache_dtype": "bfloat16",
        "batch_size": 4, "isl": 2048}


def test_query_json_prints_the_answer() -> None:
    result = runner.invoke(app, ["query", *SLOT, "--model", "moonshotai/Kimi-K3", "--tp", "3", *KEY, "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert (answer["latency_ms"], answer["kind"], answer["native"], answer["local"]) == (0.7945, "exact", 96, 32)
    assert answer["fields"]["batch_size"] == 4 and answer["fields"]["tp_size"] == 3


def test_query_human_output_names_kind_and_buckets() -> None:
    result = runner.invoke(app, ["query", *SLOT, "--native-heads", "64", "--num-heads", "8", *KEY, "--allow-substitute"])
    assert result.exit_code == 0, result.output
    assert "exact" in result.stdout and "native 96, local 8" in result.stdout
    assert "answered from the nearest native bucket, 96" in " ".join(result.stdout.split())


def test_errors_exit_with_their_code_and_no_traceback() -> None:
    not_covered = runner.invoke(app, ["query", *SLOT, "--native-heads", "64", "--tp", "8", *KEY])
    assert not_covered.exit_code == 1
    assert "Traceback" not in not_covered.output
    assert "error (not_covered)" in not_covered.stderr
    unknown = runner.invoke(app, ["query", *SLOT, "--model", "deepseek-ai/DeepSeek-V3", "--tp", "8", *KEY,
                                  "--seq-len", "9", "--json"])
    assert unknown.exit_code == 2
    err = json.loads(unknown.stdout)["error"]
    assert err["type"] == "QueryFieldError"
    assert err["message"].startswith("unknown field(s) 'seq_len' for table mla_context_module")
    dangling = runner.invoke(app, ["query", *SLOT, "--model", "deepseek-ai/DeepSeek-V3", "--tp", "8", "--isl"])
    assert dangling.exit_code == 2 and "--isl needs a value" in dangling.stderr
    twice = runner.invoke(app, ["query", *SLOT, "--model", "deepseek-ai/DeepSeek-V3", "--tp", "8", "--isl", "1024",
                                "--batch-size", "4", "--isl=2048", "--json"])
    assert twice.exit_code == 2
    # the first one is not dropped silently
    assert json.loads(twice.stdout)["error"]["message"].startswith("--isl is given twice [field='isl']")


def test_batch_keeps_going_past_bad_lines(tmp_path) -> None:
    lines = [
        json.dumps({**LINE, "model": "moonshotai/Kimi-K3", "tp_size": 3}),
        "this is not json",
        json.dumps([1, 2]),
        "",
        json.dumps({**LINE, "native_heads": 64, "tp_size": 8}),
        json.dumps({**LINE, "model": "deepseek-ai/DeepSeek-V3", "tp_size": 3}),
        json.dumps({**LINE, "model": "deepseek-ai/DeepSeek-V3", "tp_size": 4}),
    ]
    path = tmp_path / "queries.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = runner.invoke(app, ["query", "--batch", str(path)])
    assert result.exit_code == 1  # some lines failed; all were answered in order
    out = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(out) == 6  # the blank line is not a query
    assert out[0]["latency_ms"] == 0.7945 and out[0]["native"] == 96
    assert [o["error"]["type"] for o in out[1:5]] == ["QueryFieldError", "QueryFieldError", "NotCoveredError",
                                                      "ShardError"]
    assert out[1]["error"]["message"].startswith("line 2 is not JSON")
    assert out[2]["error"]["message"].startswith("line 3: a query is a JSON object, got list")
    # DeepSeek-V3's checkpoint fixes fp8_block GEMMs (Kimi-K3's, bfloat16)
    assert out[5]["latency_ms"] == 0.6848 and out[5]["native"] == 128 and out[5]["fields"]["gemm_type"] == "fp8_block"


def test_batch_from_stdin_with_slot_defaults() -> None:
    line = {k: v for k, v in LINE.items() if k not in ("table", "system", "backend", "version")}
    stdin = json.dumps({**line, "model": "deepseek-ai/DeepSeek-V3", "tp_size": 4}) + "\n"
    result = runner.invoke(app, ["query", *SLOT, "--batch", "-"], input=stdin)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["latency_ms"] == 0.6848


def test_layer_and_version_default_from_the_command_line() -> None:
    args = ["query", "context_attention", "--system", "h200_sxm", "--backend", "sglang", "--model",
            "openai/gpt-oss-120b", "--tp", "8", "--batch-size", "4", "--isl", "2048"]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2 and "give layer" in refused.stderr
    answer = json.loads(runner.invoke(app, [*args, "--layer", "sliding", "--json"]).stdout)
    assert answer["version"] == "0.5.14" and answer["version_chosen"] is True
    assert answer["fields"]["window_size"] == 128 and answer["fields"]["layer"] == "sliding"
    text = runner.invoke(app, [*args, "--layer", "sliding"]).stdout
    assert "from the model" in text and "window_size: its sliding layers use window_size 128" in text




def test_tables_without_a_head_axis_answer_by_their_own_keys() -> None:
    """A DeepEP dispatch on GB200 (EP 4, derived from its 4-GPU nodes), stored in microseconds
    with dispatch and combine side by side: asked for by phase, answered in ms."""
    import pyarrow.parquet as pq

    import modperf

    args = ["query", "wideep_deepep_normal", "--system", "gb200", "--backend", "sglang", "--version", "0.5.12",
            "--phase", "combine", "--ep-size", "4", "--node-num", "1", "--hidden-size", "7168", "--topk", "8",
            "--num-experts", "256", "--num-tokens", "128", "--sms", "20", "--kernel-source", "deepep"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    path = modperf.open().ref("gb200", "sglang", "0.5.12", "wideep_deepep_normal").path
    rows = [r for r in pq.read_table(path).to_pylist()
            if (r["hidden_size"], r["num_topk"], r["num_experts"], r["num_token"], r["combine_sms"]) == (7168, 8, 256,
                                                                                                       128, 20)]
    assert answer["kind"] == "exact" and len(rows) == 1
    assert answer["latency_ms"] == (rows[0]["combine_transmit_us"] + rows[0]["combine_notify_us"]) / 1000.0
    human = runner.invoke(app, args)
    assert human.exit_code == 0 and "exact" in human.stdout and "heads" not in human.stdout


# -- `modperf query --batch FILE` alone, started without the parser --------------------------------


def test_only_a_batch_alone_is_started_without_the_parser() -> None:
    assert batch_path(["query", "--batch", "q.jsonl"]) == ("q.jsonl", False)
    assert batch_path(["query", "--batch=q.jsonl"]) == ("q.jsonl", False)
    assert batch_path(["--no-cache", "query", "--batch", "-"]) == ("-", True)
    for args in ([], ["query"], ["query", "--batch"], ["query", "--batch="], ["query", "--batch", "--json"],
                 ["query", "--batch", "q.jsonl", "--json"], ["query", "--batch", "q.jsonl", "--isl", "8"],
                 ["query", "mla_context_module", "--batch", "q.jsonl"], ["predict", "--batch", "q.jsonl"],
                 ["--no-cache"], ["ls", "--batch", "q.jsonl"], ["query", "--batch", "-x"]):
        assert batch_path(args) is None, args


def _both_ways(argv: list[str], capsys, monkeypatch) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    """``modperf ARGV`` through the entry point (a batch alone: without the parser), then with
    every batch going through the typer command."""
    from tests.helpers import run_main

    from modperf.cli import _batch

    started = []
    monkeypatch.setattr(_batch, "run_alone", lambda args: (started.append(run_alone(args)), started[-1])[1])
    first = run_main(argv, capsys)
    assert started and started[0] is not None  # (it was started without the parser)
    monkeypatch.setattr(_batch, "run_alone", lambda args: None)
    return first, run_main(argv, capsys)


def test_a_batch_alone_writes_what_the_command_writes(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("MODPERF_NO_CACHE", "0")  # (--no-cache sets it to 1: put back after the test)
    path = tmp_path / "q.jsonl"
    heads = {"model": "moonshotai/Kimi-K3", "tp_size": 3}
    lines = [json.dumps({**LINE, **heads, "isl": isl}) for isl in (2048, 3000, 10**7, "x")] + ["{", "", "{}"]
    path.write_text("\n".join(lines * 40) + "\n")
    alone, command = _both_ways(["query", "--batch", str(path)], capsys, monkeypatch)
    assert alone == command
    assert alone[0] == 1 and len(alone[1].splitlines()) == 240 and alone[2] == ""
    assert sum('"kind": "exact"' in line for line in alone[1].splitlines()) == 40
    path.write_text(json.dumps({**LINE, **heads}) + "\n")
    assert _both_ways(["--no-cache", "query", f"--batch={path}"], capsys, monkeypatch)[0][0] == 0


def test_a_batch_alone_reports_an_error_mid_way_as_the_command_does(tmp_path, capsys, monkeypatch) -> None:
    import sys

    from modperf import errors as E
    from modperf.cli import _batch, query_cmd

    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(LINE) + "\n")
    for failure, code in ((E.QueryFieldError("cannot read the batch input: gone", file=str(path), fix="retry"), 2),
                          (RuntimeError("a bug"), 3), (KeyboardInterrupt(), 130)):
        def failing(db, batch, stream, fields, failure=failure):
            stream.close()
            sys.stdout.write("an answer\n")
            raise failure

        monkeypatch.setattr(_batch, "answer_batch", failing)
        monkeypatch.setattr(query_cmd, "answer_batch", failing)
        alone, command = _both_ways(["query", "--batch", str(path)], capsys, monkeypatch)
        assert alone == command and alone[0] == code and alone[1] == "an answer\n"
