"""``modperf check --quality``: findings are reported and never change the exit code."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from modperf.cli import app

runner = CliRunner()


def test_quality_json_keeps_exit_code_0() -> None:
    result = runner.invoke(app, ["check", "--table", "msa_generation_module", "--quality", "--json",
                                 "--quality-examples", "3"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is True
    q = data["quality"]
    assert q["thresholds"] == {"monotone_tolerance": 0.25, "spike_factor": 3.0, "cross_factor": 10.0,
                               "min_delta_ms": 0.01}
    assert q["totals"]["cross_file"] == 7446
    trt = [f for f in q["files"] if f["system"] == "h200_sxm" and f["backend"] == "trtllm"][0]
    assert len([x for x in trt["findings"] if x["kind"] == "cross_file"]) == 3  # capped by --quality-examples


def test_quality_thresholds_are_options() -> None:
    result = runner.invoke(app, ["check", "--table", "msa_generation_module", "--quality", "--json",
                                 "--cross-factor", "1000", "--monotone-tolerance", "100"])
    assert result.exit_code == 0
    totals = json.loads(result.stdout)["quality"]["totals"]
    assert totals["non_monotone"] == 0 and 0 < totals["cross_file"] < 7446


def test_quality_rich_output_and_bad_threshold() -> None:
    result = runner.invoke(app, ["check", "--table", "msa_generation_module", "--quality"])
    assert result.exit_code == 0
    assert "quality findings per table" in result.stdout and "cross-file" in result.stdout
    assert runner.invoke(app, ["check", "--table", "msa_generation_module", "--quality",
                               "--spike-factor", "0.5"]).exit_code == 2
