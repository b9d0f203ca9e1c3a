"""The serving model: what a backend does with a deployment, and TTFT / TPOT from its steps.

* :mod:`.model`: the closed-loop arithmetic on step times (aggregated and disaggregated);
* :mod:`.backend`: what a backend is (:class:`Backend`) and its fitted constants (:class:`Fitted`);
* one module per backend, owning its rules and carrying its constants: :mod:`.vllm`,
  :mod:`.sglang`, :mod:`.trtllm` (adding a backend is one such module, registered in
  :data:`BACKENDS`; docs/serving.md, "Backends: one module each");
* :mod:`.memory`: weights and KV per GPU, the running-request cap, the fit check, the KV
  transfer between pools;
* :mod:`.fit`: the fit of the constants on calibration rows (``bench/silicon.py --fit``).

* :mod:`.predict`: a deployment (flags, or a row of ``silicon_sample.csv``) priced from the op
  tables (:mod:`modperf.model.step`) and solved by the serving model;
* :mod:`.silicon`: the measured deployments the corpus ships, the fixed calibration / evaluation
  split, the scoreboard's pricing and the fit;
* :mod:`.simulate`: a request-level simulation of one rank's scheduler on plain data (continuous
  batching, chunked prefill, KV admission and preemption, closed or open loop), jumping between
  scheduling events; :mod:`.percentiles` prices its step grid for a deployment and runs it
  (``predict --percentiles``), with the simulation's own constants (:mod:`.simulation_constants`,
  written by ``bench/silicon.py --simulate --fit`` from calibration rows only).

May import: numpy, pyarrow; modperf.base, modperf.fast, modperf.specs, modperf.data, modperf.query,
modperf.model.
"""

from __future__ import annotations

from ..base import errors as E
from .backend import ANY_GENERATION, GENERATIONS, KV_BYTES, LARGE_GPU_BYTES, Backend, Fitted, generation_of
from .memory import (
    PoolMemory,
    SystemMemory,
    kv_bytes_per_token,
    kv_transfer_ms,
    pool_memory,
    system_memory,
    weight_bytes_per_gpu,
)
from .model import (
    AggInputs,
    Constants,
    DisaggInputs,
    ServingTimes,
    aggregated,
    chunks,
    disaggregated,
    mean_kv,
    packed_requests,
)
from .sglang import SGLang
from .trtllm import TRTLLM
from .vllm import VLLM

#: Every backend with serving rules, by name.
BACKENDS: dict[str, Backend] = {b.name: b for b in (SGLang(), TRTLLM(), VLLM())}


def backend_of(name: str) -> Backend:
    """The backend called ``name``; an OptionValueError naming the ones that have rules."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise E.OptionValueError(f"no serving rules for backend {E.quote(name)}", values={"backend": name},
                                 fix=f"backends with serving rules: {', '.join(sorted(BACKENDS))}") from None


def chunk_tokens(backend: Backend, mem_capacity: float) -> int:
    """The backend's per-step token budget on a GPU of ``mem_capacity`` bytes."""
    return backend.step_budget(mem_capacity)


def kv_budget_bytes(backend: Backend, *, mem_capacity: float, weights: float, other: float, chunk: int,
                    gpus: int) -> float:
    """Bytes of one GPU the backend's memory rule leaves for the KV cache (its own rule:
    :meth:`Backend.kv_budget_bytes`)."""
    return backend.kv_budget_bytes(mem_capacity=mem_capacity, weights=weights, other=other, chunk=chunk, gpus=gpus)


__all__ = [
    "ANY_GENERATION",
    "BACKENDS",
    "GENERATIONS",
    "KV_BYTES",
    "LARGE_GPU_BYTES",
    "TRTLLM",
    "VLLM",
    "AggInputs",
    "Backend",
    "Constants",
    "DisaggInputs",
    "Fitted",
    "PoolMemory",
    "SGLang",
    "ServingTimes",
    "SystemMemory",
    "aggregated",
    "backend_of",
    "chunk_tokens",
    "chunks",
    "disaggregated",
    "generation_of",
    "kv_budget_bytes",
    "kv_bytes_per_token",
    "kv_transfer_ms",
    "mean_kv",
    "packed_requests",
    "pool_memory",
    "system_memory",
    "weight_bytes_per_gpu",
]
