"""The command that starts a deployment on its backend (``modperf search --launch``).

Every flag is spelled as the backend's own documentation spells it at the release the tables
were measured on (docs/search.md, "Launch commands", lists each with its source):

* vLLM -- ``vllm serve`` engine arguments (``--tensor-parallel-size``, ``--data-parallel-size``,
  ``--enable-expert-parallel``, ``--max-num-seqs``, ``--max-num-batched-tokens``,
  ``--kv-cache-dtype``, ``--quantization``; docs.vllm.ai "Engine Arguments" and "Data Parallel
  Deployment"); disaggregated pools through the NixlConnector (``--kv-transfer-config``,
  ``VLLM_NIXL_SIDE_CHANNEL_PORT``) behind the proxy of vLLM's "NixlConnector Usage Guide"
  (``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``).
* SGLang -- ``python -m sglang.launch_server`` server arguments (``--model-path``, ``--tp-size``,
  ``--dp-size``, ``--enable-dp-attention``, ``--ep-size``, ``--max-running-requests`` (for the
  whole server: SGLang divides it over its DP-attention ranks), ``--chunked-prefill-size``,
  ``--kv-cache-dtype``); disaggregated pools with ``--disaggregation-mode prefill|decode`` and
  ``--disaggregation-transfer-backend nixl`` behind ``python -m sglang_router.launch_router
  --pd-disaggregation --prefill URL --decode URL`` (SGLang "PD Disaggregation").
* TRT-LLM -- ``trtllm-serve MODEL`` options (``--tp_size``, ``--ep_size``, ``--max_batch_size``,
  ``--max_num_tokens``, ``--config`` YAML with ``enable_attention_dp``, ``kv_cache_config.dtype``
  and, for disaggregated pools, ``cache_transceiver_config`` and ``disable_overlap_scheduler``),
  and ``trtllm-serve disaggregated -c FILE`` for the router (tensorrt_llm/commands/serve.py and
  TensorRT-LLM's "Disaggregated Serving" at 1.3.0rc).

Each command sets exactly what the search priced: the parallelism, the running requests per
rank (the batch), the per-step token budget, the KV dtype; memory fractions stay the backends'
defaults, which the memory rule assumed. Workers are placed on consecutive GPUs of nodes of
``gpus_per_node`` (the system file); a worker spanning nodes gets a note naming the backend's
multi-node launcher instead of ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import shlex
from typing import Any

from ..base.jsonio import dumps
from ..serving.predict import Deployment, Pool, served_dtypes
from ..specs.roofline import gpu_spec

#: Where the routers listen and the workers' first ports.
ROUTER_PORT = 8000
PORTS = {"vllm": (8000, 8100, 8200), "sglang": (30000, 30000, 30100), "trtllm": (8000, 8100, 8200)}
NIXL_SIDE_CHANNEL_PORT = 5600
#: KV dtype names per backend (vLLM --kv-cache-dtype, SGLang --kv-cache-dtype, TRT-LLM kv_cache_config.dtype).
_KV = {"vllm": {"fp8": "fp8"}, "sglang": {"fp8": "fp8_e4m3"}, "trtllm": {"fp8": "fp8"}}
VLLM_PROXY = "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"


def _q(value: Any) -> str:
    return shlex.quote(str(value))


class _Placer:
    """Consecutive GPUs, node by node: a worker that fits a node never straddles two."""

    def __init__(self, per_node: int) -> None:
        self.per_node = max(1, per_node)
        self.next = 0

    def take(self, gpus: int) -> tuple[int, list[int] | None]:
        """(the node of the worker's first GPU, its GPUs on that node; None when it spans nodes)."""
        if gpus <= self.per_node and self.next % self.per_node + gpus > self.per_node:
            self.next += self.per_node - self.next % self.per_node
        first = self.next
        self.next += gpus
        node = first // self.per_node
        if gpus > self.per_node:
            return node, None
        local = first % self.per_node
        return node, list(range(local, local + gpus))


def _quant_flags(dep: Deployment, config_quant: tuple[str | None, str | None], notes: list[str]) -> list[str]:
    """Online quantization where the served GEMM dtype is fp8 on a 16-bit checkpoint (vLLM and
    SGLang ``--quantization fp8``); any other served dtype needs a checkpoint stored that way."""
    own_gemm, own_moe = config_quant
    gemm, moe, _ = served_dtypes(own_gemm, own_moe, dep.gemm_quant, dep.moe_quant)
    if (gemm, moe) == (own_gemm, own_moe):
        return []
    if dep.backend in ("vllm", "sglang") and gemm in ("fp8",) and (moe in (None, "fp8") or moe == own_moe):
        return ["--quantization", "fp8"]
    notes.append(f"serves gemm {gemm} / moe {moe}: start it from a checkpoint quantized that way (the backend has "
                 "no online quantization flag for it)")
    return []


def _pool_flags(backend: str, pool: Pool, chunk: int, kv: str | None) -> tuple[list[str], dict[str, Any]]:
    """The parallelism, batch, token budget and KV dtype flags of one worker (and the TRT-LLM
    --config entries)."""
    batch = pool.batch or 1
    moe = pool.moe_tp is not None
    gpus = pool.tp * pool.attention_dp
    extra: dict[str, Any] = {}
    if backend == "vllm":
        flags = ["--tensor-parallel-size", str(pool.tp)]
        if pool.attention_dp > 1:
            flags += ["--data-parallel-size", str(pool.attention_dp)]
        if moe and pool.moe_ep > 1:
            flags += ["--enable-expert-parallel"]
        flags += ["--max-num-seqs", str(batch), "--max-num-batched-tokens", str(chunk)]
        if kv:
            flags += ["--kv-cache-dtype", _KV["vllm"].get(kv, kv)]
        return flags, extra
    if backend == "sglang":
        flags = ["--tp-size", str(gpus)]
        if pool.attention_dp > 1:
            flags += ["--dp-size", str(pool.attention_dp), "--enable-dp-attention"]
        if moe and pool.moe_ep > 1:
            flags += ["--ep-size", str(pool.moe_ep)]
        flags += ["--max-running-requests", str(batch * pool.attention_dp), "--chunked-prefill-size", str(chunk)]
        if kv:
            flags += ["--kv-cache-dtype", _KV["sglang"].get(kv, kv)]
        return flags, extra
    flags = ["--tp_size", str(gpus)]
    if moe and pool.moe_ep > 1:
        flags += ["--ep_size", str(pool.moe_ep)]
    flags += ["--max_batch_size", str(batch), "--max_num_tokens", str(chunk)]
    if pool.attention_dp > 1:
        extra["enable_attention_dp"] = True
    if kv:
        extra["kv_cache_config"] = {"dtype": _KV["trtllm"].get(kv, kv)}
    return flags, extra


def _yaml(entries: dict[str, Any], indent: int = 0) -> str:
    """The small YAML TRT-LLM's --config files hold (mappings, lists of strings, scalars)."""
    lines: list[str] = []
    pad = " " * indent
    for key, value in entries.items():
        if isinstance(value, dict):
            lines.append(f"{pad}{key}:")
            lines.append(_yaml(value, indent + 2))
        elif isinstance(value, list):
            lines.append(f"{pad}{key}:")
            lines += [f"{pad}  - {dumps(v)}" for v in value]
        elif isinstance(value, bool):
            lines.append(f"{pad}{key}: {'true' if value else 'false'}")
        else:
            lines.append(f"{pad}{key}: {value}")
    return "\n".join(lines)


def _env(gpus: list[int] | None, extra: dict[str, Any] | None = None) -> list[str]:
    env = [f"CUDA_VISIBLE_DEVICES={','.join(map(str, gpus))}"] if gpus is not None else []
    return env + [f"{k}={v}" for k, v in (extra or {}).items()]


def _multi_node(backend: str, gpus: int, per_node: int) -> str:
    how = {"vllm": "a Ray cluster over those nodes (vLLM's distributed serving guide)",
           "sglang": "one process per node with --nnodes, --node-rank and --dist-init-addr",
           "trtllm": "mpirun / srun with trtllm-llmapi-launch"}[backend]
    return f"this worker takes {gpus} GPUs over {-(-gpus // per_node)} nodes of {per_node}: start it with {how}"


def launch_commands(dep: Deployment, replicas: int, chunk: int, config_quant: tuple[str | None, str | None]
                    ) -> list[dict[str, Any]]:
    """The commands that start ``dep`` (``replicas`` copies when aggregated), one entry per
    process: ``{"role", "node", "command", "files", "notes"}``; ``files`` are the config files
    the command reads (name -> text). For a disaggregated deployment, one entry per worker of
    each pool and one for the router."""
    backend, model = dep.backend, dep.model
    per_node = gpu_spec(dep.system).gpus_per_node
    placer = _Placer(per_node)
    first_port, prefill_port, decode_port = PORTS[backend]
    out: list[dict[str, Any]] = []
    common_notes: list[str] = []
    quant = _quant_flags(dep, config_quant, common_notes)

    def worker(role: str, pool: Pool, port: int, index: int, disagg: str | None) -> dict[str, Any]:
        gpus = pool.tp * pool.attention_dp
        node, local = placer.take(gpus)
        flags, extra = _pool_flags(backend, pool, chunk, dep.kv_cache_dtype)
        notes = [] if local is not None else [_multi_node(backend, gpus, per_node)]
        files: dict[str, str] = {}
        env_extra: dict[str, Any] = {}
        if backend == "vllm":
            cmd = ["vllm", "serve", model, "--port", str(port), *flags, *quant]
            if disagg:
                env_extra["VLLM_NIXL_SIDE_CHANNEL_PORT"] = NIXL_SIDE_CHANNEL_PORT + index * pool.attention_dp
                transfer = {"kv_connector": "NixlConnector",
                            "kv_role": "kv_producer" if disagg == "prefill" else "kv_consumer"}
                cmd += ["--kv-transfer-config", dumps(transfer, separators=(",", ":"))]
        elif backend == "sglang":
            cmd = ["python", "-m", "sglang.launch_server", "--model-path", model, "--port", str(port), *flags,
                   *quant]
            if disagg:
                cmd += ["--disaggregation-mode", disagg, "--disaggregation-transfer-backend", "nixl"]
        else:
            if disagg:
                extra["cache_transceiver_config"] = {"backend": "DEFAULT"}
                if disagg == "prefill":
                    extra["disable_overlap_scheduler"] = True
            cmd = ["trtllm-serve", model, "--host", "localhost", "--port", str(port), *flags]
            if extra:  # one file per pool: its workers are alike
                name = f"trtllm_{disagg or 'agg'}.yaml"
                files[name] = _yaml(extra) + "\n"
                cmd += ["--config", name]
        text = " ".join([*_env(local, env_extra), *(_q(c) for c in cmd)])
        return {"role": role, "node": node, "gpus": gpus, "port": port, "command": text, "files": files,
                "notes": notes}

    if dep.mode == "agg":
        assert dep.pool is not None
        for r in range(replicas):
            out.append(worker(f"replica {r + 1}/{replicas}", dep.pool, first_port + r, r, None))
        if replicas > 1:
            common_notes.append(f"{replicas} replicas on ports {first_port}..{first_port + replicas - 1}: put any "
                                "HTTP load balancer in front")
    else:
        assert dep.prefill is not None and dep.decode is not None
        pw, dw = dep.prefill.workers, dep.decode.workers
        assert pw is not None and dw is not None  # a searched deployment names both pools' workers
        pre = [worker(f"prefill {i + 1}/{pw}", dep.prefill, prefill_port + i, i, "prefill") for i in range(pw)]
        dec = [worker(f"decode {i + 1}/{dw}", dep.decode, decode_port + i, pw * dep.prefill.attention_dp + i, "decode")
               for i in range(dw)]
        out += pre + dec
        host = "localhost"
        files: dict[str, str] = {}
        if backend == "vllm":
            cmd = ["python", VLLM_PROXY, "--port", str(ROUTER_PORT), "--prefiller-hosts", *[host] * len(pre),
                   "--prefiller-ports", *[str(w["port"]) for w in pre], "--decoder-hosts", *[host] * len(dec),
                   "--decoder-ports", *[str(w["port"]) for w in dec]]
        elif backend == "sglang":
            cmd = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
            for w in pre:
                cmd += ["--prefill", f"http://{host}:{w['port']}"]
            for w in dec:
                cmd += ["--decode", f"http://{host}:{w['port']}"]
            cmd += ["--host", "0.0.0.0", "--port", str(ROUTER_PORT)]
        else:
            files["disagg_config.yaml"] = _yaml({
                "hostname": host, "port": ROUTER_PORT, "backend": "pytorch",
                "context_servers": {"num_instances": len(pre), "urls": [f"{host}:{w['port']}" for w in pre]},
                "generation_servers": {"num_instances": len(dec), "urls": [f"{host}:{w['port']}" for w in dec]},
            }) + "\n"
            cmd = ["trtllm-serve", "disaggregated", "-c", "disagg_config.yaml"]
        out.append({"role": "router", "node": 0, "gpus": 0, "port": ROUTER_PORT,
                    "command": " ".join(_q(c) for c in cmd), "files": files,
                    "notes": ["workers on other nodes: replace localhost by their hosts"]
                    if any(w["node"] for w in pre + dec) else []})
    if common_notes:
        out[0]["notes"] = common_notes + out[0]["notes"]
    return out


__all__ = ["launch_commands"]
