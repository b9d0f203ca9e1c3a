"""Child process for ``bench/search.py``: ``aiconfigurator cli default`` on the issue's inputs,
timed, with the size of the space it priced.

modperf never imports aiconfigurator; this script runs in an interpreter that has it installed
(``/work/scratch/aic-venv/bin/python``). It counts the tool's own pricing calls while its
command runs: ``run_agg`` (one aggregated (parallel, batch, context-tokens) point) and
``run_static`` / ``run_static_latency_only`` (one prefill or decode worker candidate, which its
disaggregated sweep pairs by rate matching), and the distinct (parallel layout, batch)
deployments behind them, and prints one JSON line: ``{"seconds", "cpu_seconds", "agg_points",
"static_points", "agg_deployments", "prefill_candidates", "decode_candidates", "exit"}``.

    python aiconfigurator_search.py OUT_DIR -- ARGS OF `aiconfigurator cli default`
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import resource
import sys
import time
from collections import Counter
from typing import Any


def _count(cls: Any, name: str, counter: Counter[str], key: str, seen: dict[str, set[Any]]) -> None:
    original = cls.__dict__.get(name)
    if original is None:
        return

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        counter[key] += 1
        model, config = (kwargs.get("model", args[0] if args else None),
                         kwargs.get("runtime_config", args[2] if len(args) > 2 else None))
        batch = getattr(config, "batch_size", None)
        if key == "agg_points":  # the distinct (parallel layout, batch) deployments behind the points
            seen["agg"].add((id(model), batch))
        else:  # static_ctx (a prefill worker candidate) or static_gen (a decode one)
            mode = kwargs.get("mode", args[3] if len(args) > 3 else None)
            seen[str(mode)].add((id(model), batch))
        return original(self, *args, **kwargs)

    setattr(cls, name, counted)


def main() -> int:
    out_dir = sys.argv[1]
    args = sys.argv[sys.argv.index("--") + 1:]
    start = time.perf_counter()
    counter: Counter[str] = Counter()
    seen: dict[str, set[Any]] = collections.defaultdict(set)
    import importlib

    from aiconfigurator_core.sdk.backends.base_backend import BaseBackend

    for name in ("sglang_backend", "trtllm_backend", "vllm_backend"):
        importlib.import_module(f"aiconfigurator_core.sdk.backends.{name}")
    classes = [BaseBackend]
    while classes:
        cls = classes.pop()
        _count(cls, "run_agg", counter, "agg_points", seen)
        _count(cls, "run_static", counter, "static_points", seen)
        _count(cls, "run_static_latency_only", counter, "static_points", seen)
        classes += cls.__subclasses__()
    from aiconfigurator.main import main as tool_main

    sys.argv = ["aiconfigurator", *args, "--save-dir", out_dir]
    code = 0
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            code = tool_main() or 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    usage = resource.getrusage(resource.RUSAGE_SELF)
    sys.stdout.write(json.dumps({"seconds": time.perf_counter() - start, "cpu_seconds": usage.ru_utime + usage.ru_stime,
                                 "agg_points": counter["agg_points"], "static_points": counter["static_points"],
                                 "agg_deployments": len(seen["agg"]), "prefill_candidates": len(seen["static_ctx"]),
                                 "decode_candidates": len(seen["static_gen"]), "exit": code}) + "\n")
    sys.stdout.flush()
    os._exit(0)  # the tool's worker threads and pools end with the process


if __name__ == "__main__":
    sys.exit(main())
