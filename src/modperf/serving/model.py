"""The serving model: TTFT and TPOT of a deployment from the step costs of its engine.

Pure arithmetic on step times (milliseconds) that :mod:`modperf.predict` prices from the op
tables; nothing here reads a table. docs/serving.md states the model, its assumptions and
every constant with where it comes from. In short:

* **Aggregated** (continuous batching, closed loop of ``batch`` users per attention-DP rank,
  zero think time): Little's law ``X = B / (TTFT + (O - 1) * TPOT)``; the engine spends the
  share ``U = X * W * (B - 1) / B`` of its time on the other users' prefill work ``W`` each; a decoding user advances
  once per step, so ``TPOT = s_dec * t_decode / (1 - U)``, never more than a step carrying a
  full prefill chunk beside the decodes; ``TTFT = tau0 + TPOT / 2 + s_pre * p1 + kappa *
  (B - 1) / 2 * W`` (the frontend, half a running step, its own prefill, and the wave of other
  users' prefills it queues behind), never below the engine's prefill capacity. When the
  KV cache holds fewer than ``B`` running requests, the rest wait in the admission queue.
* **Disaggregated**: TPOT is the decode pool's step (no prefill beside it); TTFT is the
  prefill pool's (its own prefill, its queue, the KV transfer to the decode pool).

Backend defaults that are not fitted (chunk sizes, memory fractions, scheduler kind) are
:data:`BACKENDS`; the fitted constants are :mod:`modperf.serving_constants`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from . import errors as E
from .roofline import gpu_spec

GiB = 2**30
MiB = 2**20


@dataclass(frozen=True)
class Backend:
    """What a backend does by default (not fitted; sources in docs/serving.md)."""

    name: str
    #: Per-step token budget: vLLM max_num_batched_tokens, TRT-LLM max_num_tokens, SGLang
    #: chunked_prefill_size (8192 below 160 GB of GPU memory, 16384 from there).
    chunk_tokens: int
    chunk_tokens_large_gpu: int
    #: "mixed": prefill chunks ride in the decode steps (vLLM decode-first, TRT-LLM in-flight);
    #: "prefill_first": prefill steps run alone and stall the decodes (SGLang without mixed chunks).
    scheduler: str
    #: Most requests running at once per rank (vLLM max_num_seqs, TRT-LLM max_batch_size,
    #: SGLang: the KV pool alone decides).
    max_running: int
    #: KV blocks reserved per request: the whole sequence (TRT-LLM GUARANTEED_NO_EVICT) or as it
    #: grows (vLLM, SGLang: on average isl + osl / 2).
    reserves_whole_sequence: bool


BACKENDS: dict[str, Backend] = {
    "vllm": Backend("vllm", 8192, 8192, "mixed", 1024, False),
    "trtllm": Backend("trtllm", 8192, 8192, "mixed", 2048, True),
    "sglang": Backend("sglang", 8192, 16384, "prefill_first", 1 << 20, False),
}

#: SGLang's chunk doubles on GPUs with at least this much memory (server_args: >= 160 GB).
LARGE_GPU_BYTES = 160e9


def backend_of(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise E.OptionValueError(f"no serving defaults for backend {E.quote(name)}", values={"backend": name},
                                 fix=f"backends with serving defaults: {', '.join(sorted(BACKENDS))}") from None


def chunk_tokens(backend: Backend, mem_capacity: float) -> int:
    return backend.chunk_tokens_large_gpu if mem_capacity >= LARGE_GPU_BYTES else backend.chunk_tokens


def kv_budget_bytes(backend: Backend, *, mem_capacity: float, weights: float, other: float, chunk: int,
                    gpus: int) -> float:
    """Bytes of one GPU left for the KV cache under the backend's memory rule:
    vLLM ``0.90 * capacity - weights - other``; TRT-LLM ``0.90 * (capacity - weights - other)``;
    SGLang ``mem_fraction_static * capacity - weights`` with its reserve of 512 MiB + 1.5 MiB per
    chunk token + 2 MiB per CUDA-graph batch (512) + tp/8 GiB, at least 10 GiB on large GPUs.
    ``other`` is the system file's ``misc.other_mem`` (activations, CUDA graphs, NCCL)."""
    if backend.name == "vllm":
        return 0.90 * mem_capacity - weights - other
    if backend.name == "trtllm":
        return 0.90 * (mem_capacity - weights - other)
    reserved = 512 * MiB + 1.5 * MiB * max(chunk, 2048) + 2 * MiB * 512 + gpus / 8 * GiB
    if mem_capacity > 60e9:
        reserved = max(reserved, 10 * GiB)
    return mem_capacity - reserved - weights


@dataclass(frozen=True)
class Constants:
    """The fitted constants of one backend (docs/serving.md): ``s_pre`` and ``s_dec`` scale the
    op tables' prefill and decode steps to the measured backend versions; ``tau0_ms`` is the
    per-request path outside the engine (frontend, tokenizer, first-token streaming); ``kappa``
    is how synchronised the closed loop's prefills are (0: random phases, 1: all at once)."""

    s_pre: float = 1.0
    s_dec: float = 1.0
    tau0_ms: float = 0.0
    kappa: float = 0.0
    #: Engine steps a new request waits through besides its prefill: half a running step on
    #: average. Not fitted: letting it float per backend did not improve the calibration
    #: rows' cross-validation (docs/serving.md, "Form choices").
    steps_waited: float = 0.5



@dataclass
class AggInputs:
    """Step costs (ms) and shape of one aggregated deployment, per attention-DP rank."""

    batch: int  # concurrent users per rank (closed loop)
    isl: int
    osl: int
    prefill_one_ms: float  # one request's prefill alone (chunked where isl > chunk)
    packed: int  # requests packed into one prefill step
    prefill_packed_ms: float  # one prefill step of `packed` requests
    decode_ms: float  # one decode step of `batch` requests at the mean kv length
    capped_ms: float  # a step carrying the decodes and a full prefill chunk
    max_running: int  # requests the KV cache (and the backend) let run at once


@dataclass
class ServingTimes:
    ttft_ms: float
    tpot_ms: float
    #: How the answer was reached: throughput, utilisation, queueing terms, whether the capacity
    #: bound or the admission queue decided it.
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _agg_closed_loop(x: AggInputs, c: Constants, batch: int) -> ServingTimes:
    """Solve the closed loop for ``batch`` running users (no admission queue)."""
    w = c.s_pre * x.prefill_packed_ms / x.packed  # one request's share of prefill work
    td = c.s_dec * x.decode_ms
    cap = c.s_dec * x.decode_ms + c.s_pre * (x.capped_ms - x.decode_ms)
    cap = max(cap, td)
    own = c.s_pre * x.prefill_one_ms
    rounds = x.osl - 1

    others = (batch - 1) / batch  # a user's own prefill is in its TTFT, not beside its decodes

    def times(rate: float) -> tuple[float, float, float, bool]:
        u = rate * w * others
        tpot = min(td / (1.0 - u), cap) if u < 1.0 else cap
        ttft = c.tau0_ms + c.steps_waited * tpot + own + c.kappa * (batch - 1) / 2.0 * w
        floor = batch * cap / x.packed - rounds * tpot  # prefill capacity: `packed` per capped step
        bound = floor > ttft
        return max(ttft, floor), tpot, u, bound

    # g(X) = X - B / (TTFT(X) + (O - 1) TPOT(X)) rises with X: bisect for its root
    lo, hi = 0.0, batch / max(own + c.tau0_ms, 1e-9)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        ttft, tpot, _, _ = times(mid)
        if mid * (ttft + rounds * tpot) > batch:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * hi:
            break
    rate = 0.5 * (lo + hi)
    ttft, tpot, u, bound = times(rate)
    return ServingTimes(ttft, tpot, {
        "requests_per_s_per_rank": rate * 1000.0, "prefill_utilisation": u, "capacity_bound": bound,
        "queue_ms": c.kappa * (batch - 1) / 2.0 * w, "own_prefill_ms": own, "decode_step_ms": td,
        "capped_step_ms": cap, "running": batch})


def aggregated(x: AggInputs, c: Constants) -> ServingTimes:
    """TTFT and TPOT of an aggregated deployment (module doc)."""
    if x.max_running < 1:
        raise E.NotCoveredError("the KV cache of one rank does not hold one request of this length",
                                values={"isl": x.isl, "osl": x.osl}, fix="use more GPUs per rank, a shorter "
                                "sequence or a smaller KV dtype")
    if x.batch <= x.max_running:
        out = _agg_closed_loop(x, c, x.batch)
        out.detail["admission_wait_ms"] = 0.0
        return out
    m = x.max_running
    inner = _agg_closed_loop(x, c, m)
    cycle = inner.ttft_ms + (x.osl - 1) * inner.tpot_ms
    wait = (x.batch - m) / m * cycle  # the queue drains at m requests per cycle
    inner.detail.update(admission_wait_ms=wait, waiting=x.batch - m)
    return ServingTimes(inner.ttft_ms + wait, inner.tpot_ms, inner.detail)


@dataclass
class DisaggInputs:
    concurrency: int  # closed-loop users over the whole deployment
    isl: int
    osl: int
    prefill_ranks: int  # prefill workers x their attention-DP ranks
    prefill_one_ms: float
    prefill_packed_ms: float  # one prefill step of `packed` requests on a prefill rank
    packed: int
    decode_ms: float  # one decode step of the decode rank's batch at the mean kv length
    kv_transfer_ms: float


def disaggregated(x: DisaggInputs, c: Constants) -> ServingTimes:
    """TTFT and TPOT of a disaggregated deployment (module doc); ``steps_waited`` has no part
    here (no decode step runs before a request's prefill on its pool)."""
    tpot = c.s_dec * x.decode_ms
    w = c.s_pre * x.prefill_packed_ms / x.packed
    own = c.s_pre * x.prefill_one_ms
    per_rank = x.concurrency / x.prefill_ranks
    queue = c.kappa * max(0.0, (per_rank - 1.0) / 2.0) * w
    ttft = c.tau0_ms + own + x.kv_transfer_ms + queue
    floor = x.concurrency * w / x.prefill_ranks - (x.osl - 1) * tpot  # prefill pool capacity (Little)
    bound = floor > ttft
    return ServingTimes(max(ttft, floor), tpot, {
        "own_prefill_ms": own, "queue_ms": queue, "kv_transfer_ms": x.kv_transfer_ms, "capacity_bound": bound,
        "prefill_utilisation": x.concurrency / (max(ttft, floor) + (x.osl - 1) * tpot) * w / x.prefill_ranks})


def packed_requests(batch: int, isl: int, chunk: int) -> int:
    """Requests of ``isl`` tokens that fit in one step's budget (at least one, at most batch)."""
    return max(1, min(batch, chunk // isl))


def chunks(isl: int, chunk: int) -> list[tuple[int, int]]:
    """(tokens, prefix) of each chunk of one request's prefill."""
    return [(min(chunk, isl - start), start) for start in range(0, isl, chunk)]


def mean_kv(isl: int, osl: int) -> int:
    """The kv length of the average decode step (half-way through the output)."""
    return isl + osl // 2


@dataclass(frozen=True)
class SystemMemory:
    """One GPU's memory (``gpu.mem_capacity``) and the reserve the system file keeps for
    activations, CUDA graphs and NCCL (``misc.other_mem``), in bytes."""

    capacity: float
    other: float


def system_memory(system: str) -> SystemMemory:
    """The memory of ``system`` from its yaml, as :func:`modperf.roofline.gpu_spec` reads it; a
    SystemSpecError where the file is missing or gives no capacity."""
    gpu = gpu_spec(system)
    if not gpu.from_file or gpu.mem_capacity <= 0:
        from .catalog import embedded_systems_dir

        path = embedded_systems_dir() / f"{system}.yaml"
        reason = "no positive gpu.mem_capacity" if gpu.from_file else "no system file"
        raise E.SystemSpecError(f"no memory size for system {E.quote(system)}: {reason}", file=path,
                                fix=f"add {path.name} with gpu.mem_capacity (bytes) and misc.other_mem beside "
                                    "the data")
    return SystemMemory(gpu.mem_capacity, gpu.other_mem)


__all__ = [
    "BACKENDS",
    "AggInputs",
    "Backend",
    "Constants",
    "DisaggInputs",
    "ServingTimes",
    "aggregated",
    "backend_of",
    "chunk_tokens",
    "chunks",
    "disaggregated",
    "kv_budget_bytes",
    "mean_kv",
    "packed_requests",
    "system_memory",
]
