"""Percentiles of a deployment's TTFT, TPOT and end-to-end latency: the deployment's engine
steps priced from the op tables as a grid (:class:`modperf.serving.simulate.StepTimes`), its backend's
scheduler as plain data (:class:`modperf.serving.simulate.Scheduler`), and the request-level
simulation (:func:`modperf.serving.simulate.simulate`) of a closed loop at the deployment's
concurrency or an open loop at a request rate. docs/serving.md, "The simulation".

The grid is priced with :func:`modperf.model.step.step_cost`, the closed form's pricer: a
decode step at each batch and three KV lengths (the workload's range), what prefill tokens add
to a step of decodes besides their attention, and the prefill attention of one sequence's
first ``x`` tokens when ``n`` sequences prefill together. The fitted ``s_pre`` / ``s_dec``
scale the prefill and decode parts of every step, and ``tau0`` is the path outside the
engine, as in the closed form; the closed form's ``kappa`` and ``steps_waited`` have no part
here (the simulation plays the queueing they stand for).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..base import errors as E
from ..model.step import DecodePart, SeqChunk, step_cost
from . import backend_of, chunk_tokens, mean_kv, system_memory
from .simulate import Scheduler, SimConstants, Simulated, StepTimes, Workload, simulate

if TYPE_CHECKING:
    from ..query.db import Database
    from .predict import Deployment, Priced

#: What each backend's scheduler does (docs/serving.md, "The simulation"; the step budget and
#: the running limit are the serving model's, modperf.serving.BACKENDS):
#: vLLM v1 schedules the running requests first (a decode takes one token of
#: max_num_batched_tokens, a prefill in progress its next chunk), then waiting requests first
#: come first served while max_num_seqs and the token budget allow, chunking a prompt to the
#: budget left; KV blocks are allocated for the tokens scheduled, and where they run out the
#: newest running request is preempted and recomputed later (vllm/v1/core/sched/scheduler.py).
#: TRT-LLM's in-flight batching puts context and generation requests in one step under
#: max_num_tokens; its default capacity policy GUARANTEED_NO_EVICT admits a request only when
#: the blocks of its whole sequence can be reserved, and never pauses one. Context chunking
#: (enable_chunked_prefill) is off by default but on in the measured deployments: the
#: calibration rows serve DeepSeek-R1 on gb200 at isl 8192 = max_num_tokens with up to 2150
#: concurrent users, where an unchunked 8192-token context could never share a step with a
#: decode (Dynamo's TRT-LLM recipes set it too).
#: SGLang runs a prefill batch alone whenever one can be formed (chunked_prefill_size tokens),
#: and a decode batch otherwise; it admits a request when the free KV pool covers its prompt and
#: the new-token-ratio share of what the running requests and it may still generate, and
#: retracts the newest running request when a decode step does not fit.
SCHEDULERS: dict[str, dict[str, Any]] = {
    "vllm": {"mixed": True, "chunked": True, "admission": "as_needed"},
    "trtllm": {"mixed": True, "chunked": True, "admission": "whole_sequence"},
    "sglang": {"mixed": False, "chunked": True, "admission": "new_token_ratio"},
}
#: Requests a closed loop simulates by default: this many rounds of the concurrency, at least
#: MIN_REQUESTS; an open loop simulates OPEN_REQUESTS.
ROUNDS = 10
MIN_REQUESTS = 1000
OPEN_REQUESTS = 10000
#: The closed loop's form (chosen by cross-validation on calibration rows; docs/serving.md):
#: the first wave (every user's first request, sent at once) measured or not, and whether the
#: users stop once the requests are sent (a benchmark's drain).
MEASURE_FIRST_WAVE = True
DRAIN = True


def _log_points(top: int, lowest: int = 1, per_octave: int = 2) -> list[int]:
    """Integers from ``lowest`` to ``top`` spaced about evenly on a log scale, both ends kept."""
    out = {lowest, top}
    x = float(lowest)
    while x < top:
        out.add(round(x))
        x *= 2 ** (1 / per_octave)
    return sorted(v for v in out if lowest <= v <= top)


@dataclass
class _Parts:
    """One step priced, split into its attention ops and the rest (ms, pipeline hops in the rest)."""

    attention: float | None  # None: an attention op not covered
    other: float


def _parts(priced: Priced, prefill: SeqChunk | None, decode: DecodePart | None, *, need_attention: bool) -> _Parts:
    pricer = priced.pricer
    assert pricer is not None
    dep = priced.deployment
    step = step_cost(pricer.db, model=pricer.model, system=dep.system, backend=dep.backend,
                     parallel=pricer.parallel, version=pricer.version, prefill=prefill, decode=decode,
                     # a decode-only step is replayed as a CUDA graph, as the closed form prices it
                     graphed=prefill is None, allow_substitute=pricer.allow_substitute)
    attention = 0.0
    other = pricer.hop_ms
    missing = []
    for op in step.ops:
        if op.ms is None:
            if op.component == "attention" and not need_attention:
                attention = math.nan
                continue
            missing.append(op)
            continue
        if op.component == "attention":
            attention += op.ms * op.count
        else:
            other += op.ms * op.count
    if missing:
        reasons = "; ".join(f"{op.name}: {op.reason}" for op in missing[:3])
        raise E.NotCoveredError(f"a step of the simulation's grid is partial ({_shape(prefill, decode)}): {reasons}",
                                values={"model": pricer.model, "system": dep.system, "backend": dep.backend},
                                fix="see `modperf estimate --scope model` for the ops no table covers")
    return _Parts(None if math.isnan(attention) else attention, other)


def _shape(prefill: SeqChunk | None, decode: DecodePart | None) -> str:
    parts = []
    if prefill is not None:
        parts.append(f"prefill {prefill.batch} x {prefill.tokens} tokens")
    if decode is not None:
        parts.append(f"decode {decode.batch} at kv {decode.kv}")
    return ", ".join(parts)


def step_times(priced: Priced, *, step_tokens: int, max_decode: int, max_prefill_seqs: int, mixed: bool
               ) -> tuple[StepTimes, list[str]]:
    """The simulation's grid for ``priced``'s pool (module doc), and notes on what it had to
    fill in: a decode step at the ends of the kv range that an attention table does not reach
    is the step at the mean kv (the closed form's point, which must be covered) moved by the
    nearest batch's slope in kv; prefill attention where a table does not reach a grid point
    is scaled from the nearest priced point of the same row (or row below), linearly in
    tokens."""
    dep = priced.deployment
    isl, osl = dep.isl, dep.osl
    notes: list[str] = []
    mid = mean_kv(isl, osl)
    kvs = sorted({isl + 1, mid, isl + osl})
    batches = _log_points(max(max_decode, 1))
    decode_rows: list[list[float | None]] = []
    decode_other: dict[int, float] = {}
    for d in batches:
        decode_row: list[float | None] = []
        for kv in kvs:
            parts = _parts(priced, None, DecodePart(d, kv), need_attention=False)
            decode_row.append(None if parts.attention is None else parts.attention + parts.other)
            if kv == mid:
                decode_other[d] = parts.other
        decode_rows.append(decode_row)
    decode = _fill_kv(decode_rows, kvs, kvs.index(mid), batches, notes)
    # what prefill tokens add to a step, besides their attention
    top = min(step_tokens, max(isl, 1) * max(max_prefill_seqs, 1))
    tokens = sorted(set(_log_points(top, 1, 1)) | {t for t in (isl, min(isl, step_tokens), top) if 1 <= t <= top})
    extra_batches = [0] + ([d for d in _log_points(max_decode, 1, 1)] if mixed and max_decode >= 1 else [])
    extra = [[0.0] * len(extra_batches) for _ in tokens]
    for i, p in enumerate(tokens):
        for j, d in enumerate(extra_batches):
            parts = _parts(priced, SeqChunk(1, p, 0), DecodePart(d, mid) if d else None, need_attention=False)
            base = decode_other.get(d)
            if d and base is None:
                base = _parts(priced, None, DecodePart(d, mid), need_attention=True).other
            extra[i][j] = max(parts.other - (base or 0.0), 0.0)
    # prefill attention per sequence of its first x tokens, n sequences in the step
    first = min(isl, step_tokens)
    xs = sorted({max(1, first // 8), max(1, first // 4), max(1, first // 2), first})
    boundaries = list(range(step_tokens, isl, step_tokens))  # later chunks of a prompt over the budget
    ns = _log_points(max(1, min(max_prefill_seqs, max_decode or 1)), 1, 1)
    rows: list[list[float | None]] = []
    for n in ns:
        row: list[float | None] = []
        for x in xs:
            parts = _parts(priced, SeqChunk(n, x, 0), None, need_attention=False)
            row.append(None if parts.attention is None else parts.attention / n)
        rows.append(row)
    attention = _fill(rows, xs, ns, notes)
    if boundaries or isl > first:
        # chunks after the first: batch-1 attention at their prefix, the closed form's chunks
        cumulative = attention[0][-1]
        extra_x, extra_vals = [], []
        for start in [*boundaries]:
            size = min(step_tokens, isl - start)
            parts = _parts(priced, SeqChunk(1, size, start), None, need_attention=True)
            assert parts.attention is not None
            cumulative += parts.attention
            extra_x.append(start + size)
            extra_vals.append(cumulative)
        xs = xs + extra_x
        attention = [row + [row[-1] + (v - attention[0][-1]) for v in extra_vals] for row in attention]
    grid = StepTimes(decode_batch=tuple(batches), decode_kv=tuple(kvs), decode_ms=tuple(map(tuple, decode)),
                     extra_tokens=tuple(tokens), extra_batch=tuple(extra_batches), extra_ms=tuple(map(tuple, extra)),
                     attention_batch=tuple(ns), attention_tokens=(0, *xs),
                     attention_ms=tuple((0.0, *row) for row in attention))
    return grid, notes


def _fill_kv(rows: list[list[float | None]], kvs: list[int], mid: int, batches: list[int], notes: list[str]
             ) -> list[list[float]]:
    """Decode steps no attention table reaches: at the mean kv, interpolated linearly in the
    batch between the nearest batches priced there (the nearest one's value past them); at the
    kv ends, the mean-kv step moved along the nearest complete batch's slope (flat where no
    batch has one)."""
    priced_mid = [i for i, row in enumerate(rows) if row[mid] is not None]
    if not priced_mid:
        raise E.NotCoveredError(f"no decode attention table reaches kv {kvs[mid]} at any batch up to {batches[-1]}",
                                values={"kv": kvs[mid], "batch": batches[-1]},
                                fix="see `modperf estimate --scope model` for the ops no table covers")
    for i, row in enumerate(rows):
        if row[mid] is None:
            below = [k for k in priced_mid if k < i]
            above = [k for k in priced_mid if k > i]
            if below and above:
                lo, hi = below[-1], above[0]
                y0, y1 = rows[lo][mid], rows[hi][mid]
                assert y0 is not None and y1 is not None
                row[mid] = y0 + (y1 - y0) * (batches[i] - batches[lo]) / (batches[hi] - batches[lo])
            else:
                row[mid] = rows[(below or above)[-1 if below else 0]][mid]
            notes.append(f"decode step of {batches[i]} at kv {kvs[mid]}: no attention table reaches it; "
                         "interpolated in the batch")
    complete = [i for i, row in enumerate(rows) if all(v is not None for v in row)]
    out = []
    for i, row in enumerate(rows):
        if i in complete:
            out.append([float(v) for v in row if v is not None])
            continue
        centre = row[mid]
        assert centre is not None
        near = min(complete, key=lambda k: abs(k - i)) if complete else None
        filled = []
        for j, v in enumerate(row):
            if v is None:
                slope = 0.0
                if near is not None:
                    ref = rows[near]
                    lo_v, hi_v = ref[0], ref[-1]
                    assert lo_v is not None and hi_v is not None
                    slope = (hi_v - lo_v) / (kvs[-1] - kvs[0]) if kvs[-1] > kvs[0] else 0.0
                v = centre + slope * (kvs[j] - kvs[mid])
                notes.append(f"decode step of {batches[i]} at kv {kvs[j]}: no attention table reaches it; the step "
                             f"at kv {kvs[mid]} moved along batch {batches[near] if near is not None else '-'}'s slope")
            filled.append(v)
        out.append(filled)
    return out


def _fill(rows: list[list[float | None]], xs: list[int], ns: list[int], notes: list[str]) -> list[list[float]]:
    """Grid points no attention table reaches, scaled from the nearest priced point of the row
    (linearly in tokens), or from the row of fewer sequences."""
    out: list[list[float]] = []
    for i, row in enumerate(rows):
        known = [(x, v) for x, v in zip(xs, row) if v is not None]
        if not known:
            if not out:
                raise E.NotCoveredError(f"no prefill attention table reaches one sequence of {xs[-1]} tokens",
                                        values={"tokens": xs[-1]}, fix="see `modperf estimate --scope model`")
            out.append(list(out[-1]))
            notes.append(f"prefill attention of {ns[i]} sequences at once taken per sequence from {ns[i - 1]}")
            continue
        filled = []
        for x, v in zip(xs, row):
            if v is None:
                kx, kv = min(known, key=lambda p: abs(math.log(p[0] / x)))
                v = kv * x / kx
                notes.append(f"prefill attention of {ns[i]} x {x} tokens scaled from {ns[i]} x {kx}")
            filled.append(v)
        out.append(filled)
    return out


def scheduler_for(priced: Priced, *, max_running: int | None = None) -> Scheduler:
    """The deployment's backend scheduler (:data:`SCHEDULERS`), its step budget and running
    limit (modperf.serving.BACKENDS; ``max_running`` lowers it, as a deployment's
    max_num_seqs does) and the rank's KV cache in tokens (the serving model's memory rule)."""
    dep = priced.deployment
    backend = backend_of(dep.backend)
    memory = system_memory(dep.system)
    per_token = float(priced.memory.get("kv_bytes_per_token") or 0.0)
    budget = float(priced.memory.get("kv_budget_gib_per_gpu") or 0.0) * 2**30
    kv_tokens = int(budget // per_token) if per_token > 0 else None
    kind = SCHEDULERS.get(dep.backend)
    if kind is None:
        raise E.OptionValueError(f"no scheduler for backend {E.quote(dep.backend)}", values={"backend": dep.backend},
                                 fix=f"backends the simulation knows: {', '.join(sorted(SCHEDULERS))}")
    running = backend.max_running if max_running is None else min(backend.max_running, max_running)
    return Scheduler(step_tokens=chunk_tokens(backend, memory.capacity), max_running=running,
                     kv_tokens=kv_tokens, name=dep.backend, **kind)


@dataclass
class Prepared:
    """A deployment ready to simulate: its grid and scheduler (independent of the constants)."""

    priced: Priced
    steps: StepTimes
    scheduler: Scheduler
    notes: list[str]


def prepare(priced: Priced, *, request_rate: float | None = None) -> Prepared:
    """The grid and scheduler of an aggregated deployment ``priced`` (module doc). In an open
    loop (``request_rate``) the deployment's batch is the most requests a rank runs at once
    (its max_num_seqs / max_batch_size / max_running_requests); in a closed loop it is the
    users per rank."""
    dep = priced.deployment
    if dep.mode != "agg" or priced.pricer is None or dep.pool is None:
        raise E.OptionValueError("percentiles are simulated for aggregated deployments only",
                                 values={"mode": dep.mode}, fix="drop --percentiles for a disaggregated deployment")
    if dep.pool.pp > 1:
        raise E.OptionValueError("the simulation runs one pipeline stage (pp 1); no measured deployment has pp > 1",
                                 values={"pp": dep.pool.pp}, fix="drop --percentiles, or use pp 1")
    assert dep.pool.batch is not None
    scheduler = scheduler_for(priced, max_running=None if request_rate is None else dep.pool.batch)
    running = min(scheduler.max_running, dep.pool.batch)
    if scheduler.kv_tokens is not None:
        running = min(running, max(1, scheduler.kv_tokens // (dep.isl + 1)))
    packed = scheduler.step_tokens // max(dep.isl, 1) + 1
    grid, notes = step_times(priced, step_tokens=scheduler.step_tokens, max_decode=running,
                             max_prefill_seqs=min(packed, running), mixed=scheduler.mixed)
    return Prepared(priced, grid, scheduler, notes)


def run(prepared: Prepared, constants: SimConstants, *, request_rate: float | None = None,
        requests: int | None = None, seed: int = 0, first_wave: bool | None = None, drain: bool | None = None,
        rounds: int | None = None, min_requests: int | None = None) -> Simulated:
    """Simulate ``prepared`` with ``constants``: a closed loop at the deployment's batch (per
    attention-DP rank), or an open loop at ``request_rate`` requests per second over the
    deployment (each attention-DP rank gets its share)."""
    dep = prepared.priced.deployment
    assert dep.pool is not None and dep.pool.batch is not None
    first_wave = MEASURE_FIRST_WAVE if first_wave is None else first_wave
    drain = DRAIN if drain is None else drain
    if request_rate is None:
        users = dep.pool.batch
        count = requests or max(MIN_REQUESTS if min_requests is None else min_requests,
                                (ROUNDS if rounds is None else rounds) * users)
        load = Workload(dep.isl, dep.osl, concurrency=users, requests=count,
                        warmup=0 if first_wave or users >= count else users, drain=drain,
                        delay_ms=constants.tau0_ms, osl_spread=constants.osl_spread, seed=seed)
    else:
        load = Workload(dep.isl, dep.osl, request_rate=request_rate / dep.pool.attention_dp,
                        requests=requests or OPEN_REQUESTS, delay_ms=constants.tau0_ms,
                        osl_spread=constants.osl_spread, seed=seed)
    return simulate(prepared.steps, prepared.scheduler, load, prefill_scale=constants.s_pre,
                    decode_scale=constants.s_dec)


def report(prepared: Prepared, sim: Simulated, constants: SimConstants, source: str) -> dict[str, Any]:
    """Plain data: p50 / p90 / p99 and mean of TTFT, TPOT and end-to-end latency, the
    throughput (docs/search.md's definitions), what the engine did and how it was set up."""
    priced = prepared.priced
    dep = priced.deployment
    assert dep.pool is not None
    gpus = priced.gpus
    assert gpus is not None  # None only for disaggregated deployments, which prepare() refuses
    summary = sim.summary()
    ttft, tpot = summary["ttft_ms"]["mean"], summary["tpot_ms"]["mean"]
    load = sim.workload
    if load.concurrency is not None:
        concurrency = load.concurrency * dep.pool.attention_dp
        per_gpu = concurrency * dep.osl / (ttft + (dep.osl - 1) * tpot) * 1000.0 / gpus
    else:
        per_gpu = sim.stats["requests_per_s"] * dep.pool.attention_dp * dep.osl / gpus
    notes = list(prepared.notes)
    if load.request_rate is not None and sim.stats["requests_per_s"] < 0.95 * load.request_rate:
        notes.append(f"the engine completes {sim.stats['requests_per_s']:.2f} requests/s per rank, below the "
                     f"{load.request_rate:.2f} offered: the queue grows, and the percentiles grow with the run")
    out: dict[str, Any] = {
        "loop": load.loop, **summary,
        "tokens_per_s_per_gpu": per_gpu, "tokens_per_s_per_user": 1000.0 / tpot,
        "requests": load.requests, "measured": sim.stats["measured"],
        "seed": load.seed if load.loop == "open" or load.osl_spread else None,
        "stats": {k: v for k, v in sim.stats.items() if k not in ("wall_s", "cpu_s", "requests_simulated_per_s")},
        "scheduler": prepared.scheduler.to_dict(),
        "constants": {"source": source, **vars(constants)},
        "notes": notes}
    if load.concurrency is not None:
        out["concurrency"] = load.concurrency * dep.pool.attention_dp
    else:
        assert load.request_rate is not None
        out["request_rate_per_s"] = load.request_rate * dep.pool.attention_dp
    return out


def percentiles(db: Database, dep: Deployment, *, fitted: bool = True, request_rate: float | None = None,
                requests: int | None = None, seed: int | None = None, priced: Priced | None = None
                ) -> dict[str, Any]:
    """TTFT, TPOT and end-to-end percentiles of ``dep`` (module doc), as plain data. ``seed``
    (default 0) seeds the open loop's arrivals and the output lengths; a seed given to a run
    with neither (a closed loop of exact lengths) is refused."""
    from .predict import price

    constants, source = simulation_constants(dep, fitted)
    if seed is not None and request_rate is None and not constants.osl_spread:
        raise E.UsageError("a seed changes nothing here: the closed loop's output lengths are exact (no spread "
                           "fitted, or physics only)", values={"seed": seed},
                           fix="drop --seed, or give --request-rate for an open loop")
    if priced is None:
        priced = price(db, dep)
    prepared = prepare(priced, request_rate=request_rate)
    sim = run(prepared, constants, request_rate=request_rate, requests=requests, seed=seed or 0)
    return report(prepared, sim, constants, source)


def fitted_simulation_constants() -> dict[str, SimConstants]:
    """The simulation's constants fitted per backend (modperf.serving.simulation_constants, written by
    ``bench/silicon.py --simulate --fit``); empty where none were fitted."""
    try:
        from . import simulation_constants
    except ImportError:
        return {}
    return dict(simulation_constants.AGG)


def simulation_constants(dep: Deployment, fitted: bool = True) -> tuple[SimConstants, str]:
    """The constants the simulation runs with: the backend's fitted ones; physics only (no
    scale, no frontend time, exact output lengths) where none are fitted or ``fitted`` is
    False."""
    if fitted:
        own = fitted_simulation_constants().get(dep.backend)
        if own is not None:
            from . import simulation_constants as module

            return own, module.PROVENANCE
    return SimConstants(), "physics only: no fitted constants"


__all__ = ["SCHEDULERS", "Prepared", "SimConstants", "percentiles", "prepare", "report", "run", "scheduler_for",
           "simulation_constants", "step_times"]
