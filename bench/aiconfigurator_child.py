"""Child process for bench/accuracy.py: answers op latencies with aiconfigurator-core.

modperf never imports aiconfigurator; this script runs in its own interpreter (one that has the
``aiconfigurator_core`` wheel installed) and talks JSON lines over stdin/stdout. Each request
names a systems root (a directory laid out like the wheel's ``systems/``: ``<system>.yaml``
and ``data/<system>/<family>/<backend>/<version>/<table>_perf.parquet``), the slot, and a list
of queries; the reply holds one latency (or an error message) per query.

The engine is the tool's model-less probe engine (an ``EngineSpec`` with empty op lists, bound
to one system/backend/version) in SILICON mode with the shared layer off, so that it answers
from the one table file in the root and nothing else (no sibling-version rows). Each query is
one op in the tool's ``OpSpec`` JSON wire form plus the evaluation arguments of
``AicEngine.evaluate_ops_json`` (context flag, batch, sequence, prefix): the tool's own lookup,
interpolation and extrapolation answer it.

    request:  {"root": ..., "system": ..., "backend": ..., "version": ...,
               "queries": [[op_json, is_context, batch_size, s, prefix], ...]}
    reply:    {"latency": [float | null, ...], "error": [str | null, ...]}
    first line written on start: {"ready": true, "version": ...} or {"ready": false, "error": ...}
"""

from __future__ import annotations

import json
import sys


def _engine(core, system: str, backend: str, version: str, root: str):
    engine = {
        "schema_version": 1, "model_name": "__modperf_probe__", "system_name": system, "systems_path": root,
        "backend": backend, "backend_version": version, "kv_block_size": None, "tp_size": 1, "pp_size": 1,
        "attention_dp_size": None, "moe_tp_size": None, "moe_ep_size": None, "cp_size": None,
        "weight_dtype": None, "moe_dtype": None, "activation_dtype": None, "kv_cache_dtype": None,
        "enable_shared_layer": False, "strict_provenance": False, "database_mode": "SILICON",
        "transfer_policy": None, "tolerate_dirless_version": False, "extra": {},
    }
    spec = {"schema_version": core.engine_spec_schema_version(), "engine": engine,
            "context_ops": [], "generation_ops": []}
    return core.AicEngine.from_spec(bytes(core.engine_spec_bincode_from_json(json.dumps(spec))), root)


def main() -> int:
    try:
        from importlib.metadata import version

        import aiconfigurator_core as core
        print(json.dumps({"ready": True, "version": version("aiconfigurator-core")}), flush=True)
    except Exception as exc:
        print(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        latency: list[float | None] = []
        error: list[str | None] = []
        try:
            engine = _engine(core, req["system"], req["backend"], req["version"], req["root"])
        except Exception as exc:
            n = len(req["queries"])
            print(json.dumps({"latency": [None] * n, "error": [f"engine: {exc}"] * n}), flush=True)
            continue
        for op, is_context, batch, s, prefix in req["queries"]:
            try:
                out = engine.evaluate_ops_json(json.dumps([op]), bool(is_context), int(batch), int(s), int(prefix),
                                               1.0, None)
                latency.append(float(out[0][1]))
                error.append(None)
            except Exception as exc:
                latency.append(None)
                error.append(str(exc)[:300])
        del engine
        print(json.dumps({"latency": latency, "error": error}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
