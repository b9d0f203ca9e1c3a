"""The serving model's arithmetic: TTFT and TPOT of a deployment from the step costs of its engine.

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

What each backend does (chunk sizes, memory rules, scheduler, CUDA graphs) and its fitted
constants live in its own module of :mod:`modperf.serving`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..base import errors as E


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
    #: The host's time per op of an eager step (ms): a step carrying prefill runs without a
    #: CUDA graph, so it takes at least its ops x this (docs/serving.md, "What a served step pays").
    host_op_ms: float = 0.0
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
    prefill_ops: int = 0  # ops an eager step carrying prefill launches (its host floor: x host_op_ms)
    prefill_chunks: int = 1  # eager steps of one request's own prefill
    #: "mixed": the capped step carries the decodes and a prefill chunk together; "prefill_first":
    #: a prefill step runs alone, so a decoding user's slowest step is a decode step plus it.
    scheduler: str = "mixed"


@dataclass
class ServingTimes:
    ttft_ms: float | None  # None: the deployment does not fix it (disaggregated, topology unknown)
    tpot_ms: float
    #: How the answer was reached: throughput, utilisation, queueing terms, whether the capacity
    #: bound or the admission queue decided it.
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def closed_loop(batch: Any, rounds: Any, w: Any, td: Any, cap: Any, own: Any, packed: Any, c: Constants
                ) -> tuple[Any, Any, Any, Any, Any]:
    """The aggregated closed loop in closed form, on floats or numpy arrays alike (the fit
    solves every calibration row at once): ``batch`` running users, ``rounds`` = osl - 1,
    ``w`` one request's prefill work, ``td`` the decode step, ``cap`` the capped step, ``own``
    a request's own prefill, ``packed`` requests per prefill step (all scaled already).
    Returns (TTFT, TPOT, rate X per ms, prefill share U, capacity bound).

    With ``q = w (B - 1) / B`` and ``a = tau0 + own + kappa (B - 1) / 2 w`` (TTFT less the
    steps waited), TPOT ``= td / (1 - X q)`` while below the capped step, and Little's law
    ``X (a + (s + R) TPOT) = B`` is the quadratic ``a q X^2 - (a + (s + R) td + B q) X + B = 0``,
    whose smaller root is the one with ``X q < 1``. Past the capped step TPOT is ``cap`` and
    ``X = B / (a + (s + R) cap)``. The prefill capacity (``packed`` requests per capped step)
    bounds ``X`` by ``packed / cap``: ``X (max(TTFT, B cap / packed - R TPOT) + R TPOT)`` rises
    with ``X``, so the root is the smaller of the two."""
    q = w * (batch - 1) / batch
    a = c.tau0_ms + own + c.kappa * (batch - 1) / 2.0 * w
    sr = c.steps_waited + rounds
    b = a + sr * td + batch * q
    uncapped = 2.0 * batch / (b + np.sqrt(np.maximum(b * b - 4.0 * a * q * batch, 0.0)))
    capped = batch / (a + sr * cap)
    tpot_uncapped = td / np.maximum(1.0 - uncapped * q, 1e-300)
    rate = np.minimum(np.where(tpot_uncapped <= cap, uncapped, capped), packed / cap)
    u = rate * q
    tpot = np.where(u < 1.0, np.minimum(td / np.maximum(1.0 - u, 1e-300), cap), cap)
    ttft = a + c.steps_waited * tpot
    floor = batch * cap / packed - rounds * tpot
    return np.maximum(ttft, floor), tpot, rate, u, floor > ttft


def eager(ms: Any, ops: Any, c: Constants) -> Any:
    """An eager step: its scaled GPU time, at least its ops times the host's time per op (the
    host launches them one after another while the GPU runs them)."""
    return np.maximum(c.s_pre * ms, ops * c.host_op_ms)


def _agg_closed_loop(x: AggInputs, c: Constants, batch: int) -> ServingTimes:
    """Solve the closed loop for ``batch`` running users (no admission queue)."""
    floor = x.prefill_ops * c.host_op_ms  # an eager step's host floor
    w = float(eager(x.prefill_packed_ms, x.prefill_ops, c)) / x.packed  # one request's share of prefill work
    td = c.s_dec * x.decode_ms
    if x.scheduler == "prefill_first":
        cap = td + w * x.packed
    else:
        cap = max(td + c.s_pre * (x.capped_ms - x.decode_ms), td, floor)
    own = max(c.s_pre * x.prefill_one_ms, x.prefill_chunks * floor)
    ttft, tpot, rate, u, bound = closed_loop(batch, x.osl - 1, w, td, cap, own, x.packed, c)
    return ServingTimes(float(ttft), float(tpot), {
        "requests_per_s_per_rank": float(rate) * 1000.0, "prefill_utilisation": float(u),
        "capacity_bound": bool(bound), "queue_ms": c.kappa * (batch - 1) / 2.0 * w, "own_prefill_ms": own,
        "decode_step_ms": td, "capped_step_ms": cap, "running": batch})


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
    assert inner.ttft_ms is not None
    cycle = inner.ttft_ms + (x.osl - 1) * inner.tpot_ms
    wait = (x.batch - m) / m * cycle  # the queue drains at m requests per cycle
    inner.detail.update(admission_wait_ms=wait, waiting=x.batch - m)
    return ServingTimes(inner.ttft_ms + wait, inner.tpot_ms, inner.detail)


@dataclass
class DisaggInputs:
    """Step costs (ms) and shape of one disaggregated deployment. The prefill side
    (``concurrency``, ``prefill_ranks``, the prefill steps, ``kv_transfer_ms``) is None where the
    deployment gives no worker counts: TPOT (the decode pool's step) is then the only answer."""

    concurrency: int | None  # closed-loop users over the whole deployment
    isl: int
    osl: int
    prefill_ranks: int | None  # prefill workers x their attention-DP ranks
    prefill_one_ms: float | None
    prefill_packed_ms: float | None  # one prefill step of `packed` requests on a prefill rank
    packed: int
    decode_ms: float  # one decode step of the decode rank's batch at the mean kv length
    kv_transfer_ms: float | None
    prefill_ops: int = 0  # ops an eager prefill step launches
    prefill_chunks: int = 1


def disaggregated(x: DisaggInputs, c: Constants) -> ServingTimes:
    """TTFT and TPOT of a disaggregated deployment (module doc); ``steps_waited`` has no part
    here (no decode step runs before a request's prefill on its pool)."""
    tpot = c.s_dec * x.decode_ms
    if (x.concurrency is None or x.prefill_ranks is None or x.prefill_one_ms is None
            or x.prefill_packed_ms is None or x.kv_transfer_ms is None):
        return ServingTimes(None, tpot, {"decode_step_ms": tpot})
    w = float(eager(x.prefill_packed_ms, x.prefill_ops, c)) / x.packed
    own = max(c.s_pre * x.prefill_one_ms, x.prefill_chunks * x.prefill_ops * c.host_op_ms)
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


__all__ = [
    "AggInputs",
    "Constants",
    "DisaggInputs",
    "ServingTimes",
    "aggregated",
    "chunks",
    "closed_loop",
    "disaggregated",
    "mean_kv",
    "packed_requests",
]
