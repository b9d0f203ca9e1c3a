"""``modperf search`` as a user runs it (child processes, COLUMNS=80): the issue's four
deployments with --json, --plot and --launch, 80 columns, progress on stderr only, exit codes,
--out, and matplotlib missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tests.helpers import REPO, run_cli, strict_json

from modperf.serving.predict import Deployment, Pool, predict

QWEN = ["search", "--model", "Qwen/Qwen3-32B", "--system", "h200_sxm", "--gpus", "8", "--isl", "4000", "--osl", "500"]
LIMITS = ["--ttft-ms", "1000", "--tpot-ms", "30"]
#: The issue's deployments (Llama-3.1-70B resolves to its bundled config by main's renames).
DONE_WHEN = [
    ("Qwen/Qwen3-32B", "h200_sxm", "8"),
    ("meta-llama/Llama-3.1-70B", "h200_sxm", "8"),
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", "8"),
    ("deepseek-ai/DeepSeek-V3", "gb200", "32"),
]


def _run(argv: list[str], timeout: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    if env is None:
        return run_cli(argv, timeout=timeout)
    cmd = [sys.executable, "-m", "modperf", *argv]
    full = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""), **env}
    proc = subprocess.run(cmd, capture_output=True, timeout=timeout, env=full, text=True)
    return proc


@pytest.mark.slow
@pytest.mark.parametrize(("model", "system", "gpus"), DONE_WHEN)
def test_the_issues_deployments_with_json_plot_and_launch(db, tmp_path, model, system, gpus) -> None:
    """Every backend with tables, both modes: --json (strict JSON on stdout, progress on stderr
    only), --plot (a PNG) and --launch (a command per top deployment and per process)."""
    plot = tmp_path / "fronts.png"
    argv = ["search", "--model", model, "--system", system, "--gpus", gpus, "--isl", "4000", "--osl", "500",
            "--ttft-ms", "2000", "--tpot-ms", "50", "--top", "2", "--json", "--plot", str(plot), "--launch"]
    if gpus == "32":
        # at one concurrency (256 users) the 32-GPU space is enumerated whole but its batch sweep is
        # one batch a layout: 4 s instead of 40 s in the suite (bench/search.py times the whole sweep)
        argv += ["--concurrency", "256"]
    proc = _run(argv)
    assert proc.returncode == 0, proc.stderr
    doc = strict_json(proc.stdout)
    assert doc["backends"] == ["vllm", "sglang", "trtllm"] and doc["modes"] == ["agg", "disagg"]
    assert doc["written"] == [str(plot)] and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {b["backend"] for b in doc["best"] if b["mode"] == "agg"} == {"vllm", "sglang", "trtllm"}
    for mode in doc["modes"]:
        for p in doc["top"][mode]:
            assert p["launch"] and p["ttft_ms"] <= 2000 and p["tpot_ms"] <= 50
            program = {"vllm": "vllm serve", "sglang": "python -m sglang.launch_server", "trtllm": "trtllm-serve"}
            assert program[p["backend"]] in p["launch"][0]["command"]
            if mode == "disagg":
                assert p["launch"][-1]["role"] == "router"
        total = doc["counts"][mode]["total"]
        assert total["enumerated"] == total["kept"] + sum(total["left_out"].values())
    if model == "deepseek-ai/DeepSeek-V3" and system == "h200_sxm":
        # 671B parameters in fp8 need 5 of 141 GB GPUs: two pools never fit in eight
        assert doc["fronts"]["disagg"] == [] and doc["counts"]["disagg"]["total"]["kept"] == 0
        assert doc["counts"]["disagg"]["total"]["left_out"]["memory"] == doc["counts"]["disagg"]["total"]["enumerated"]
    else:
        assert doc["fronts"]["disagg"]
    first = doc["fronts"]["agg"][0]
    dep = first["deployment"]
    pool = dep["pool"]
    again = predict(db, Deployment(dep["model"], dep["system"], dep["backend"], "agg", 4000, 500,
                                   pool=Pool(pool["tp"], pool["attention_dp"], pool["moe_tp"], pool["moe_ep"],
                                             batch=pool["batch"]),
                                   kv_cache_dtype=dep["kv_cache_dtype"], token_budget=dep["token_budget"]))
    assert (first["ttft_ms"], first["tpot_ms"], first["tokens_per_s_per_gpu"]) == \
        (again.ttft_ms, again.tpot_ms, again.tokens_per_s_per_gpu)


def test_human_output_fits_80_columns(tmp_path) -> None:
    proc = _run([*QWEN, *LIMITS, "--backend", "all", "--launch", "--top", "2", "--out", str(tmp_path / "o")],
                env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("wrote ")]  # (paths stay whole)
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    text = proc.stdout
    for heading in ("agg front: tokens/s/GPU vs tokens/s/user", "disagg front: tokens/s/GPU vs tokens/s/user",
                    "best under the limits, per mode and backend", "deployments searched", "# launch agg #1"):
        assert heading in text
    routers = {"vllm": "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py",
               "sglang": "python -m sglang_router.launch_router", "trtllm": "trtllm-serve disaggregated -c"}
    disagg = [line for line in lines if line.startswith("# launch disagg #")]
    assert len(disagg) == 2 and "# router" in text
    for line in disagg:  # "# launch disagg #1 (sglang): P1:tp2 b1 D1:tp4 b56"
        assert routers[line.split("(")[1].split(")")[0]] in text
    assert "wrote " + str(tmp_path / "o" / "search.json") in text
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["front_agg.csv", "front_disagg.csv",
                                                                  "search.json", "top.csv"]


def test_usage_errors_exit_2_with_json_errors() -> None:
    proc = _run([*QWEN, "--backend", "vllm", "--kv-cache-dtype", "int4", "--json"])
    assert proc.returncode == 2
    error = json.loads(proc.stdout)["error"]
    assert error["type"] == "OptionValueError" and error["values"]["measured"] == ["bfloat16", "fp8"]
    proc = _run([*QWEN, "--tpot-ms", "30", "--tokens-per-user", "20"])
    assert proc.returncode == 2 and "--tpot-ms and --tokens-per-user say the same limit" in proc.stderr
    proc = _run(["search", "--model", "Qwen/Qwen3-32B", "--json"])
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["error"]["message"].startswith("missing --system, --gpus, --isl, --osl")
    proc = _run([*QWEN, "--plot", "fronts.pdf"])
    assert proc.returncode == 2 and "--plot writes .png or .svg files" in proc.stderr


def test_nothing_under_the_limits_exits_1() -> None:
    proc = _run([*QWEN, "--backend", "vllm", "--mode", "agg", "--ttft-ms", "1", "--json"])
    assert proc.returncode == 1
    doc = strict_json(proc.stdout)
    assert doc["best"] == [] and doc["counts"]["agg"]["total"]["kept"] == 0
    assert doc["notes"] == ["no agg deployment is in the space under the limits"]


def test_plot_without_matplotlib_is_a_typed_error(tmp_path) -> None:
    blocker = tmp_path / "block"
    (blocker / "matplotlib").mkdir(parents=True)
    (blocker / "matplotlib" / "__init__.py").write_text("raise ImportError('matplotlib is blocked here')\n")
    proc = _run([*QWEN, "--backend", "vllm", "--plot", str(tmp_path / "f.svg"), "--json"],
                env={"PYTHONPATH": str(blocker) + os.pathsep + str(REPO / "src")})
    assert proc.returncode == 2
    error = json.loads(proc.stdout)["error"]
    assert error["type"] == "MissingExtraError" and "pip install 'modperf[plot]'" in error["fix"]
    assert not (tmp_path / "f.svg").exists()


def test_svg_plot(tmp_path) -> None:
    proc = _run([*QWEN, *LIMITS, "--backend", "vllm", "--plot", str(tmp_path / "f.svg")])
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "f.svg").read_text().lstrip().startswith("<?xml")
