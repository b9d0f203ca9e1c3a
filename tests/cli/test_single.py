"""``modperf query TABLE ... --json`` answered from a persisted plan before the parser starts
(modperf.cli._single): the fields as the typer command builds them, the same bytes on stdout,
and everything unusual left to the typer command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers import REPO, run_cli

from modperf.cli._single import parse

MLA = ["query", "mla_context_module", "--system", "h200_sxm", "--backend", "trtllm", "--version", "1.3.0rc20",
       "--model", "deepseek-ai/DeepSeek-V3", "--tp", "8"]


def test_the_fields_are_the_typer_commands() -> None:
    assert parse([*MLA, "--batch-size", "4", "--isl=1024", "--json"]) == {
        "table": "mla_context_module", "system": "h200_sxm", "backend": "trtllm", "version": "1.3.0rc20",
        "model": "deepseek-ai/DeepSeek-V3", "tp_size": 8, "batch_size": "4", "isl": "1024"}
    found = parse(["query", "dsv4_csa_context_module", "--json", "--native-heads", "64", "--num-heads", "8",
                   "--allow-substitute", "--kv-cache-dtype", "fp8"])
    assert found == {"table": "dsv4_csa_context_module", "native_heads": 64, "num_heads": 8,
                     "allow_substitute": True, "kv_cache_dtype": "fp8"}
    assert list(found) == ["table", "native_heads", "num_heads", "allow_substitute", "kv_cache_dtype"]


@pytest.mark.parametrize("args", [
    [*MLA, "--batch-size", "4"],  # no --json: rich prints it
    [*MLA, "--json", "--data-root", "/x"], [*MLA, "--json", "--model-configs=/x"], [*MLA, "--json", "--batch", "f"],
    [*MLA, "--json", "--help"], [*MLA, "--json", "--tp", "4"], [*MLA, "--json", "--tp-size", "8"],
    [*MLA[:-1], "8.0", "--json"], [*MLA[:-1], "+8", "--json"], [*MLA, "--json", "--isl"],
    [*MLA, "--json", "--isl", "-1"], [*MLA, "--json", "stray"], [*MLA, "--json", "--"], [*MLA, "--json", "-h"],
    ["query", "--json", *MLA[1:]], [*MLA, "--json", "--json"], [*MLA, "--json", "--isl", "1", "--isl", "2"],
    ["--no-cache", *MLA, "--json"], ["ls", "--json"],
], ids=lambda a: " ".join(a[-3:]))
def test_anything_unusual_is_left_to_the_typer_command(args: list[str]) -> None:
    assert parse(args) is None


def _cli(argv: list[str]) -> subprocess.CompletedProcess:
    """``python -X importtime -m modperf ARGV``: stdout as text, stderr the imports."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "modperf", *argv], capture_output=True,
                          text=True, env=env, timeout=120)


QUESTIONS = [
    [*MLA, "--batch-size", "4", "--isl", "1024", "--json"],
    [*MLA, "--batch-size", "3", "--isl=1500", "--json"],
    ["query", "context_attention", "--system", "h200_sxm", "--backend", "sglang", "--version", "0.5.14",
     "--model", "Qwen/Qwen3-32B", "--tp", "4", "--batch-size", "2", "--isl", "3000", "--json"],
]


def test_a_second_process_prints_the_same_bytes_without_the_parser(cache_dir: Path) -> None:
    for at, argv in enumerate(QUESTIONS):
        fresh = run_cli(["--no-cache", *argv])
        first, second = _cli(argv), _cli(argv)
        assert fresh.returncode == first.returncode == second.returncode == 0, first.stderr[-2000:]
        assert first.stdout == second.stdout == fresh.stdout
        # the typer command wrote the plan; the second question is another point of the first's
        # plan: its first process finds the plan already
        assert ("typer" in first.stderr and "numpy" in first.stderr) == (at != 1)
        assert "typer" not in second.stderr and "numpy" not in second.stderr and "rich" not in second.stderr


def test_a_point_no_plan_answers_gets_the_typer_commands_output(cache_dir: Path) -> None:
    run_cli([*MLA, "--batch-size", "4", "--isl", "1024", "--json"])  # writes the plan
    refused = [*MLA, "--batch-size", "4096", "--isl", str(1 << 20), "--json"]
    fresh, second = run_cli(["--no-cache", *refused]), _cli(refused)
    assert fresh.returncode == second.returncode == 1
    assert second.stdout == fresh.stdout and '"kind": "out_of_coverage"' in fresh.stdout
    assert "typer" in second.stderr
