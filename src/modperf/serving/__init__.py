"""The serving model: what a backend does with a deployment, and TTFT / TPOT from its steps.

* :mod:`.model`: the closed-loop arithmetic on step times (aggregated and disaggregated);
* :mod:`.backend`: what a backend is (:class:`Backend`) and its fitted constants (:class:`Fitted`);
* one module per backend, owning its rules and carrying its constants: :mod:`.vllm`,
  :mod:`.sglang`, :mod:`.trtllm` (adding a backend is one such module, registered in
  :data:`BACKENDS`; docs/serving.md, "Adding a backend");
* :mod:`.memory`: weights and KV per GPU, the running-request cap, the fit check, the KV
  transfer between pools;
* :mod:`.fit`: the fit of the constants on calibration rows (``bench/silicon.py --fit``).

May import: errors, roofline, layers, models (by type). :mod:`modperf.predict` prices the
steps from the op tables and calls into this package; nothing here reads a table.
"""

from __future__ import annotations

from .. import errors as E
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
