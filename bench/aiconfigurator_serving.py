"""Child process for ``bench/silicon.py --tool``: aiconfigurator's own serving estimate of the
corpus's measured deployments.

modperf never imports aiconfigurator; this script runs in an interpreter that has the full
``aiconfigurator`` package installed and talks JSON lines over stdin / stdout. One process
serves many rows, so the tool loads its databases once per process, not once per row.

    python aiconfigurator_serving.py [--timeout SECONDS] [--aliases JSON]
    first line written:  {"ready": true, "tool": "aiconfigurator", "version": "0.12.0"}
                         or {"ready": false, "error": "..."} (then the process exits 1)
    each line read:      a row of silicon_sample.csv as a predict question (modperf.serving.silicon.question:
                         the deployment columns, empty ones left out)
    each line written:   {"id", "ttft_ms", "tpot_ms", "seconds"} or {"id", "error", "seconds"}, in order

How a row becomes the tool's question (``aiconfigurator.cli.api.cli_estimate``, nothing tuned):

- the model id as the row names it when the tool bundles a config under that id, otherwise the
  bundled config of the same architecture from ``--aliases`` (the same table modperf is given as
  a ``--model-configs`` folder); any other id is an error;
- ``backend_version`` left to the tool: it answers from its newest tables for the system and
  backend (no measured version of the file has tables in the wheel, for the tool as for modperf);
- the row's gemm / MoE quant modes; the tool's default database mode (SILICON) and its default
  prefill token budget;
- agg: the row's per-rank ``batch_size``, ``tp``, ``pp``, attention DP, MoE tp / ep (a missing or
  zero field takes the tool's default; a missing batch is 1);
- disagg: the row's prefill / decode pools. The tool requires both pools' batch sizes and worker
  counts; a row without them is answered with an error, as modperf refuses it.

A row that takes longer than ``--timeout`` seconds is an error (``timeout``); the parent also
kills a child that stops answering.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import time
from typing import Any


class RowTimeout(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise RowTimeout("timeout")


def _whole(row: dict[str, Any], field: str, default: int | None = None) -> int | None:
    """A count field of the row; missing, NaN and 0 (the file's "not set") take ``default``."""
    value = row.get(field)
    if value is None or (isinstance(value, float) and math.isnan(value)) or int(value) == 0:
        return default
    return int(value)


def _text(row: dict[str, Any], field: str) -> str | None:
    value = row.get(field)
    return None if value is None or value == "" else str(value)


def estimate_arguments(row: dict[str, Any], bundled: set[str], aliases: dict[str, str]) -> dict[str, Any]:
    """The keyword arguments of ``cli_estimate`` for one row (ValueError when the tool cannot be asked)."""
    model = str(row["model_path"])
    if model not in bundled:
        if model not in aliases:
            raise ValueError(f"the tool bundles no config for {model} and the bench names none")
        model = aliases[model]
    kwargs: dict[str, Any] = {
        "model_path": model, "system_name": row["system"], "mode": row["mode"], "backend_name": row["backend"],
        "backend_version": None, "isl": int(row["isl"]), "osl": int(row["osl"]),
        "gemm_quant_mode": _text(row, "gemm_quant_mode"), "moe_quant_mode": _text(row, "moe_quant_mode"),
    }
    if row["mode"] == "agg":
        kwargs.update(batch_size=_whole(row, "batch_size", 1), tp_size=_whole(row, "tp_size", 1),
                      pp_size=_whole(row, "pp_size", 1), attention_dp_size=_whole(row, "attention_dp_size", 1),
                      moe_tp_size=_whole(row, "moe_tp_size"), moe_ep_size=_whole(row, "moe_ep_size"))
        return kwargs
    pools = {f"{side}_{f}": _whole(row, f"{side}_{f}") for side in ("prefill", "decode")
             for f in ("batch_size", "num_workers")}
    missing = sorted(k for k, v in pools.items() if v is None)
    if missing:
        raise ValueError(f"disagg row without {', '.join(missing)} (the tool requires them)")
    kwargs.update(pools)
    for side in ("prefill", "decode"):
        kwargs.update({f"{side}_tp_size": _whole(row, f"{side}_tp_size", 1),
                       f"{side}_pp_size": _whole(row, f"{side}_pp_size", 1),
                       f"{side}_attention_dp_size": _whole(row, f"{side}_attention_dp_size", 1),
                       f"{side}_moe_tp_size": _whole(row, f"{side}_moe_tp_size"),
                       f"{side}_moe_ep_size": _whole(row, f"{side}_moe_ep_size")})
    kwargs["tp_size"] = kwargs["prefill_tp_size"]
    return kwargs


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=int, default=120, help="seconds one row may take")
    parser.add_argument("--aliases", default="{}", help="JSON object: model id -> bundled id of the same architecture")
    args = parser.parse_args()
    aliases = json.loads(args.aliases)

    # The protocol owns the real stdout; anything the tool prints (Python or native) goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.disable(logging.WARNING)
    try:
        from importlib.metadata import version

        from aiconfigurator.cli.api import cli_estimate
        from aiconfigurator_core.sdk.common import DefaultHFModels

        bundled = set(DefaultHFModels)
        tool_version = version("aiconfigurator")
    except Exception as exc:
        protocol.write(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
        return 1
    protocol.write(json.dumps({"ready": True, "tool": "aiconfigurator", "version": tool_version}) + "\n")

    signal.signal(signal.SIGALRM, _on_alarm)
    for line in sys.stdin:
        if not line.strip():
            continue
        row = json.loads(line)
        answer: dict[str, Any] = {"id": row.get("id")}
        start = time.perf_counter()
        try:
            kwargs = estimate_arguments(row, bundled, aliases)
            signal.alarm(args.timeout)
            try:
                result = cli_estimate(**kwargs)
            finally:
                signal.alarm(0)
            answer.update(ttft_ms=float(result.ttft), tpot_ms=float(result.tpot))
        except Exception as exc:  # every failure is this row's answer; the next row goes on
            answer["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        answer["seconds"] = round(time.perf_counter() - start, 3)
        protocol.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
