"""A request-level simulation of a serving engine's scheduler: TTFT, TPOT and end-to-end
latency of every request, hence their percentiles (docs/serving.md, "The simulation").

It takes plain data and nothing else: the engine's step times as a grid
(:class:`StepTimes`), what the backend's scheduler does (:class:`Scheduler`) and the load
(:class:`Workload`). Nothing here reads a table or knows a backend by name;
:mod:`modperf.serving.percentiles` prices the grid from the op tables and fills in each backend's
scheduler.

What one rank's engine does, step by step:

* **Continuous batching.** Every running request that has finished its prefill generates one
  token per engine step it takes part in; a request leaves the batch after ``osl`` tokens (the
  first one comes from its prefill step).
* **A per-step token budget** (``step_tokens``). In a *mixed* scheduler (vLLM, TRT-LLM) each
  decoding request takes one token of it and prefill chunks fill the rest: first the chunks of
  the running requests still in prefill, in admission order, then new requests from the
  waiting queue, first come first served. A *prefill-first* scheduler (SGLang) runs a step of
  prefill chunks alone whenever there is prefill work it can admit, and a decode step of every
  running request otherwise. With ``chunked`` a prompt is split to fit the budget; without,
  a prompt waits for a step with room for all of it.
* **KV admission.** ``as_needed`` (vLLM): a request is admitted when the cache has room for the
  chunk scheduled now; it grows by one token per decode step. ``whole_sequence`` (TRT-LLM's
  GUARANTEED_NO_EVICT): admitted only when ``isl + osl`` tokens can be reserved; never evicted.
  ``new_token_ratio`` (SGLang): admitted when the free cache covers its prompt and a
  ``ratio`` share of the tokens every running request and it may still generate (clipped at
  ``clip_tokens`` each); the ratio decays from ``ratio_init`` to ``ratio_min`` over
  ``ratio_decay_steps`` decode steps, resets when the engine idles, and rises after a retract.
* **Preemption.** Where a step's tokens do not fit the cache (``as_needed``,
  ``new_token_ratio``), the most recently admitted running request is preempted: its cache is
  freed, it goes back to the front of the waiting queue, and when admitted again it recomputes
  its prompt and the tokens it had generated (vLLM's recompute preemption, SGLang's retract).
* **Arrivals.** A closed loop of ``concurrency`` users, each sending its next request when the
  last one completes (all start at time 0, as a benchmark does), or an open loop of Poisson
  arrivals at ``request_rate`` (seeded). ``delay_ms`` is the path outside the engine
  (frontend, tokenizer, first-token streaming): a request reaches the scheduler ``delay_ms``
  after it is sent, and its TTFT and end-to-end latency count it. Output lengths are ``osl``,
  or spread uniformly by ``osl_spread`` around it (seeded): with every length equal, a closed
  loop locks into waves (requests prefilled in consecutive steps finish in consecutive decode
  steps and come back together), which a small spread breaks.

The engine does not step through time one engine step at a time: while the running set and its
composition are unchanged, only decode steps run, and the number of steps until the next event
(a completion, an arrival, the cache running out, an admission the new-token ratio allows) is
computed in closed form, as is their summed time (a decode step is linear in the batch's mean
KV length). Steps that carry prefill work are taken one at a time. ``bench/simulate.py``
measures how many requests a second this simulates.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..base import errors as E

ADMISSIONS = ("as_needed", "whole_sequence", "new_token_ratio")
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Scheduler:
    """What one rank's scheduler does (module doc), as plain data."""

    #: Tokens one engine step may carry: vLLM max_num_batched_tokens, TRT-LLM max_num_tokens,
    #: SGLang chunked_prefill_size.
    step_tokens: int
    #: Most requests running at once: vLLM max_num_seqs, TRT-LLM max_batch_size, SGLang
    #: max_running_requests.
    max_running: int
    #: Tokens the rank's KV cache holds; None: unbounded.
    kv_tokens: int | None
    #: True: prefill chunks ride in the decode steps; False: prefill steps run alone, first.
    mixed: bool = True
    #: A prompt may be split across steps to fit the budget.
    chunked: bool = True
    #: as_needed | whole_sequence | new_token_ratio (module doc).
    admission: str = "as_needed"
    #: SGLang's new-token ratio: SGLANG_INIT_NEW_TOKEN_RATIO (0.7), times
    #: SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR (0.14) for the floor, reached after
    #: SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS (600) decode steps; after a retract the ratio becomes
    #: (generated + retract_decode_steps x running) / (their output lengths + 1)
    #: (SGLANG_RETRACT_DECODE_STEPS 20); each request's remaining tokens are clipped at
    #: SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION (4096).
    ratio_init: float = 0.7
    ratio_min: float = 0.098
    ratio_decay_steps: int = 600
    retract_decode_steps: int = 20
    clip_tokens: int = 4096
    #: A label for reports (the backend whose defaults these are).
    name: str = ""

    def __post_init__(self) -> None:
        if self.admission not in ADMISSIONS:
            raise E.OptionValueError(f"admission must be one of {', '.join(ADMISSIONS)}, not "
                                     f"{E.quote(self.admission)}", values={"admission": self.admission},
                                     fix="as_needed (vLLM), whole_sequence (TRT-LLM) or new_token_ratio (SGLang)")
        for name in ("step_tokens", "max_running"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise E.OptionValueError(f"{name} must be a positive integer", values={name: value},
                                         fix=f"give {name} >= 1")
        if self.kv_tokens is not None and (not isinstance(self.kv_tokens, int) or self.kv_tokens < 1):
            raise E.OptionValueError("kv_tokens must be a positive integer or None",
                                     values={"kv_tokens": self.kv_tokens}, fix="give the tokens the KV cache holds")

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class Workload:
    """The load on one rank: fixed prompt and output lengths, a closed loop of
    ``concurrency`` users or Poisson arrivals at ``request_rate`` requests per second."""

    isl: int
    osl: int
    concurrency: int | None = None
    request_rate: float | None = None
    #: Requests simulated (sent); the first ``warmup`` of them are left out of the statistics.
    requests: int = 1000
    warmup: int = 0
    seed: int = 0
    #: Milliseconds from a request's send to the scheduler (module doc).
    delay_ms: float = 0.0
    #: Closed loop: True, the users stop once ``requests`` are sent, so the last ones run with
    #: fewer beside them (as a benchmark of N requests drains); False, the users keep sending
    #: (those requests are not measured) until every measured request has completed.
    drain: bool = True
    #: Output lengths drawn uniformly (seeded) from osl x [1 - osl_spread, 1 + osl_spread]
    #: (at least 2); 0: every request generates exactly ``osl`` tokens.
    osl_spread: float = 0.0

    def __post_init__(self) -> None:
        for name in ("isl", "requests"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise E.OptionValueError(f"{name} must be a positive integer", values={name: value},
                                         fix=f"give {name} >= 1")
        if not isinstance(self.osl, int) or self.osl < 2:
            raise E.OptionValueError("osl must be an integer >= 2 (a TPOT needs two tokens)", values={"osl": self.osl},
                                     fix="give osl >= 2")
        if (self.concurrency is None) == (self.request_rate is None):
            raise E.OptionValueError("a workload is a closed loop (concurrency) or an open loop (request_rate), "
                                     "exactly one", values={"concurrency": self.concurrency,
                                                            "request_rate": self.request_rate},
                                     fix="give concurrency=N or request_rate=R")
        if self.concurrency is not None and (not isinstance(self.concurrency, int) or self.concurrency < 1):
            raise E.OptionValueError("concurrency must be a positive integer", values={"concurrency": self.concurrency},
                                     fix="give concurrency >= 1")
        if self.request_rate is not None and not (isinstance(self.request_rate, (int, float))
                                                  and math.isfinite(self.request_rate) and self.request_rate > 0):
            raise E.OptionValueError("request_rate must be a positive number of requests per second",
                                     values={"request_rate": self.request_rate}, fix="give request_rate > 0")
        if not (0 <= self.warmup < self.requests):
            raise E.OptionValueError("warmup must leave at least one request measured",
                                     values={"warmup": self.warmup, "requests": self.requests},
                                     fix="give 0 <= warmup < requests")
        if not (isinstance(self.osl_spread, (int, float)) and 0 <= self.osl_spread < 1):
            raise E.OptionValueError("osl_spread must be in [0, 1)", values={"osl_spread": self.osl_spread},
                                     fix="give 0 <= osl_spread < 1")
        if not (math.isfinite(self.delay_ms) and self.delay_ms >= 0):
            raise E.OptionValueError("delay_ms must be a finite number >= 0", values={"delay_ms": self.delay_ms},
                                     fix="give delay_ms >= 0")

    @property
    def loop(self) -> str:
        return "closed" if self.concurrency is not None else "open"

    def to_dict(self) -> dict[str, Any]:
        return {"loop": self.loop, **{k: getattr(self, k) for k in self.__dataclass_fields__}}


# --- step times -----------------------------------------------------------------------------


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through (xs, ys), extended linearly past both ends (xs ascending)."""
    n = len(xs)
    if n == 1:
        return ys[0]
    i = bisect.bisect_right(xs, x) - 1
    i = 0 if i < 0 else (n - 2 if i > n - 2 else i)
    x0, x1 = xs[i], xs[i + 1]
    return ys[i] + (ys[i + 1] - ys[i]) * (x - x0) / (x1 - x0)


def _interp2(xs: Sequence[float], ys: Sequence[float], zs: Sequence[Sequence[float]], x: float, y: float) -> float:
    """Bilinear on the grid zs[i][j] at (xs[i], ys[j]), extended linearly past the edges."""
    if len(xs) == 1:
        return _interp(ys, zs[0], y)
    i = bisect.bisect_right(xs, x) - 1
    i = 0 if i < 0 else (len(xs) - 2 if i > len(xs) - 2 else i)
    lo, hi = _interp(ys, zs[i], y), _interp(ys, zs[i + 1], y)
    return lo + (hi - lo) * (x - xs[i]) / (xs[i + 1] - xs[i])


@dataclass(frozen=True)
class StepTimes:
    """An engine step's time (ms) as grids the simulation interpolates (piecewise-linear,
    extended linearly past the grid). A step of ``d`` decoding requests at mean KV length
    ``kv`` with prefill chunks ``(tokens, prefix)`` of ``n`` sequences costs

        decode(d, kv) + extra(p, d) + sum over chunks of [A_n(prefix + tokens) - A_n(prefix)]

    where ``p`` is the chunks' total tokens; ``decode`` is the decode-only step (0 at d = 0),
    ``extra`` what ``p`` prefill tokens add to it besides their attention, and ``A_n(x)`` the
    attention of one sequence's first ``x`` prompt tokens when ``n`` sequences prefill in one
    step. A decode step is linear in ``kv`` between the grid's kv points."""

    decode_batch: tuple[int, ...]  # d points, ascending, from 1
    decode_kv: tuple[int, ...]  # kv points, ascending
    decode_ms: tuple[tuple[float, ...], ...]  # [d][kv]
    extra_tokens: tuple[int, ...]  # p points, ascending, from 1
    extra_batch: tuple[int, ...]  # d points, ascending, from 0
    extra_ms: tuple[tuple[float, ...], ...]  # [p][d]
    attention_batch: tuple[int, ...] = (1,)  # n points, ascending, from 1
    attention_tokens: tuple[int, ...] = (0, 1)  # x points, ascending, from 0
    attention_ms: tuple[tuple[float, ...], ...] = ((0.0, 0.0),)  # [n][x]

    def __post_init__(self) -> None:
        shapes = (("decode_ms", self.decode_ms, self.decode_batch, self.decode_kv),
                  ("extra_ms", self.extra_ms, self.extra_tokens, self.extra_batch),
                  ("attention_ms", self.attention_ms, self.attention_batch, self.attention_tokens))
        for name, grid, rows, cols in shapes:
            if not rows or not cols or len(grid) != len(rows) or any(len(r) != len(cols) for r in grid):
                raise E.OptionValueError(f"{name} must be a grid of len(rows) x len(columns) values",
                                         values={"rows": len(rows), "columns": len(cols)},
                                         fix="give one value per grid point")
            for axis in (rows, cols):
                if list(axis) != sorted(set(axis)):
                    raise E.OptionValueError(f"the axes of {name} must be strictly ascending",
                                             values={"axis": list(axis)[:20]}, fix="sort the grid points")
            if not all(math.isfinite(v) and v >= 0 for r in grid for v in r):
                raise E.OptionValueError(f"{name} holds a negative or non-finite time", fix="give times >= 0 (ms)")

    @classmethod
    def constant(cls, *, prefill_ms: float, decode_ms: float) -> StepTimes:
        """Fixed step costs: a decode step ``decode_ms`` whatever its batch and KV, and
        ``prefill_ms`` more for any step that carries prefill work (tests, examples)."""
        return cls(decode_batch=(1,), decode_kv=(1,), decode_ms=((decode_ms,),), extra_tokens=(1,),
                   extra_batch=(0,), extra_ms=((prefill_ms,),))

    def decode(self, d: int, kv: float) -> float:
        return 0.0 if d == 0 else _interp2(self.decode_batch, self.decode_kv, self.decode_ms, d, kv)

    def extra(self, p: int, d: int) -> float:
        return _interp2(self.extra_tokens, self.extra_batch, self.extra_ms, p, d)

    def attention(self, n: int, x: float) -> float:
        """A_n(x): the attention of one sequence's first ``x`` prompt tokens, n sequences in the step."""
        return 0.0 if x <= 0 else _interp2(self.attention_batch, self.attention_tokens, self.attention_ms, n, x)

    def decode_line(self, d: int, kv_low: float, kv_high: float) -> tuple[float, float]:
        """(alpha, beta) of the decode step at batch d as ``alpha + beta * kv``, through the
        grid at the two kv lengths given (the workload's range)."""
        lo, hi = self.decode(d, kv_low), self.decode(d, kv_high)
        beta = (hi - lo) / (kv_high - kv_low) if kv_high > kv_low else 0.0
        return lo - beta * kv_low, beta

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# --- the result -----------------------------------------------------------------------------


@dataclass
class Simulated:
    """Every measured request's TTFT, TPOT and end-to-end latency (ms, in send order) and what
    the engine did."""

    workload: Workload
    scheduler: Scheduler
    ttft_ms: Any  # numpy arrays
    tpot_ms: Any
    e2e_ms: Any
    stats: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, float]]:
        """p50 / p90 / p99 and mean of each metric (numpy's linear percentiles)."""
        import numpy as np

        out = {}
        for name, values in (("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms), ("e2e_ms", self.e2e_ms)):
            pct = np.percentile(values, PERCENTILES)
            out[name] = {**{f"p{p}": float(v) for p, v in zip(PERCENTILES, pct)}, "mean": float(np.mean(values))}
        return out


# --- the engine -----------------------------------------------------------------------------


def simulate(steps: StepTimes, scheduler: Scheduler, workload: Workload, *, prefill_scale: float = 1.0,
             decode_scale: float = 1.0) -> Simulated:
    """Run ``workload`` through ``scheduler`` on ``steps`` (module doc). ``prefill_scale`` and
    ``decode_scale`` multiply the prefill and decode parts of every step (the fitted ``s_pre``
    and ``s_dec``). Raises NotCoveredError when a request can never be admitted (its prompt
    does not fit the cache)."""
    import numpy as np

    started, cpu_started = time.perf_counter(), time.process_time()
    isl, osl, total = workload.isl, workload.osl, workload.requests
    budget_tokens = scheduler.step_tokens
    max_running = scheduler.max_running
    cap = scheduler.kv_tokens if scheduler.kv_tokens is not None else 1 << 62
    mixed, chunked = scheduler.mixed, scheduler.chunked or isl > budget_tokens
    admission = scheduler.admission
    evicts = admission != "whole_sequence"
    ratio_mode = admission == "new_token_ratio"
    # request slots: a closed loop that does not drain sends up to `concurrency` unmeasured ones more
    slots = total + (workload.concurrency or 0) * (not workload.drain)
    if workload.osl_spread > 0:
        lo_out = max(2, round(osl * (1 - workload.osl_spread)))
        hi_out = max(lo_out, round(osl * (1 + workload.osl_spread)))
        olen = np.random.default_rng([workload.seed, 2]).integers(lo_out, hi_out + 1, slots).tolist()
    else:
        lo_out = hi_out = osl
        olen = [osl] * slots
    if admission == "whole_sequence" and isl + hi_out > cap:
        raise E.NotCoveredError(f"one request of {isl} + {hi_out} tokens does not fit the rank's KV cache "
                                f"({cap} tokens)", values={"isl": isl, "osl": hi_out, "kv_tokens": cap},
                                fix="use more GPUs per rank or shorter sequences")
    if evicts and isl + 1 > cap:
        raise E.NotCoveredError(f"one prompt of {isl} tokens does not fit the rank's KV cache ({cap} tokens)",
                                values={"isl": isl, "kv_tokens": cap}, fix="use more GPUs per rank or shorter prompts")
    sp, sd = float(prefill_scale), float(decode_scale)
    delay = float(workload.delay_ms)
    clip = scheduler.clip_tokens
    r_init, r_min = scheduler.ratio_init, scheduler.ratio_min
    r_decay = (r_init - r_min) / max(scheduler.ratio_decay_steps, 1)
    ratio = r_init

    # the decode step at batch d as alpha + beta * mean kv (over the workload's kv range)
    kv_lo, kv_hi = isl + 1, isl + hi_out
    lines: dict[int, tuple[float, float]] = {}

    def line(d: int) -> tuple[float, float]:
        ab = lines.get(d)
        if ab is None:
            a, b = steps.decode_line(d, kv_lo, kv_hi)
            ab = lines[d] = (sd * a, sd * b)
        return ab

    extra_memo: dict[tuple[int, int], float] = {}
    attn_memo: dict[tuple[int, int], float] = {}
    attention = steps.attention

    def prefill_ms(chunks: list[tuple[int, int, int]], d: int) -> float:
        p = 0
        n = len(chunks)
        acc = 0.0
        for _, t, prefix in chunks:
            p += t
            key = (n, prefix + t)
            hi = attn_memo.get(key)
            if hi is None:
                hi = attn_memo[key] = attention(n, prefix + t)
            if prefix:
                key = (n, prefix)
                lo = attn_memo.get(key)
                if lo is None:
                    lo = attn_memo[key] = attention(n, prefix)
                hi -= lo
            acc += hi
        key2 = (p, d)
        ex = extra_memo.get(key2)
        if ex is None:
            ex = extra_memo[key2] = steps.extra(p, d)
        return sp * (ex + acc)

    # per-request state (index = send order)
    send = [0.0] * slots
    first = [math.nan] * slots
    done = [math.nan] * slots
    produced = [0] * slots  # tokens generated so far
    need = [isl] * slots  # prompt tokens the current prefill pass computes (isl, more after a recompute)
    computed = [0] * slots  # of them, computed so far
    g0 = [0] * slots  # decode counter when it started decoding
    base = [0] * slots  # its KV tokens then
    finish = [0] * slots  # decode counter at which it completes
    state = bytearray(slots)  # 0 not running, 1 prefilling, 2 decoding, 3 done

    now = 0.0
    counter = 0  # decode steps taken (a step with at least one decoding request)
    arrivals: deque[tuple[float, int]] = deque()  # (time at the scheduler, rid), in time order
    created = 0
    if workload.concurrency is not None:
        first_wave = min(workload.concurrency, total)
        for rid in range(first_wave):
            arrivals.append((delay, rid))  # every user sends at time 0
        created = first_wave
    else:
        rate = workload.request_rate
        assert rate is not None
        rng = np.random.default_rng(workload.seed)
        times = np.cumsum(rng.exponential(1000.0 / float(rate), size=total))
        for rid, t in enumerate(times.tolist()):
            send[rid] = t
            arrivals.append((t + delay, rid))
        created = total
    closed = workload.concurrency is not None

    waiting: deque[int] = deque()
    running: dict[int, None] = {}  # admission order: the last is preempted first
    prefilling: list[int] = []  # running requests still in prefill, in admission order
    heap: list[tuple[int, int]] = []  # (finish counter, rid) of decoding requests
    d = 0  # decoding requests
    kv_const = 0  # sum over decoders of (base - g0 + 1): their kv sum is kv_const + d * counter
    dec_held = 0  # sum over decoders of (base - g0): their cache is dec_held + d * counter
    out_const = 0  # sum over decoders of (produced at start - g0): generated = out_const + d * counter
    out_dec = 0  # sum over decoders of their output lengths
    pre_held = 0  # cache held by prefilling requests
    reserved = 0  # whole-sequence reservations
    completed = 0
    events = steps_taken = preemptions = max_seen = 0

    def used() -> int:
        return pre_held + dec_held + d * counter

    def preempt_newest() -> int:
        nonlocal d, kv_const, dec_held, out_const, out_dec, pre_held, preemptions
        rid, _ = running.popitem()
        if state[rid] == 2:
            gen = produced[rid] + (counter - g0[rid])
            d -= 1
            out_dec -= olen[rid]
            kv_const -= base[rid] - g0[rid] + 1
            dec_held -= base[rid] - g0[rid]
            out_const -= produced[rid] - g0[rid]
            produced[rid] = gen
            need[rid] = isl + gen
        else:
            prefilling.remove(rid)
            pre_held -= computed[rid]
        computed[rid] = 0
        state[rid] = 0
        waiting.appendleft(rid)
        preemptions += 1
        return rid

    def reserve_tokens() -> int:
        """SGLang: the tokens the running requests may still generate, each clipped."""
        if hi_out <= clip:
            rem = out_dec - (out_const + d * counter)
            for rid in prefilling:
                rem += olen[rid] - produced[rid]
            return rem
        rem = 0
        for rid in running:
            left = (finish[rid] - counter) if state[rid] == 2 else olen[rid] - produced[rid]
            rem += left if left < clip else clip
        return rem

    def running_chunks(budget: int) -> list[tuple[int, int, int]]:
        """The next chunk of each running request still in prefill, in admission order."""
        out = []
        for rid in prefilling:
            if budget <= 0:
                break
            t = need[rid] - computed[rid]
            if t > budget:
                t = budget
            out.append((rid, t, computed[rid]))
            budget -= t
        return out

    while completed < total:
        events += 1
        while arrivals and arrivals[0][0] <= now:
            waiting.append(arrivals.popleft()[1])
        if not running and not waiting:
            if not arrivals:
                break
            now = arrivals[0][0]
            ratio = r_init  # an idle scheduler resets its ratio
            continue
        # --- compose the next step
        preempted = False
        budget = budget_tokens - d if mixed else budget_tokens
        chunks = running_chunks(budget) if prefilling else []
        free = cap - (pre_held + dec_held + d * counter)
        if evicts and (d if (mixed or not chunks) else 0) + (sum(c[1] for c in chunks) if chunks else 0) > free:
            # the step's tokens must fit the cache: the decodes' (one each, when they run) and the
            # running prefills'; else the newest running request is preempted, until they fit
            while running:
                preempt_newest()
                preempted = True
                budget = budget_tokens - d if mixed else budget_tokens
                chunks = running_chunks(budget)
                free = cap - (pre_held + dec_held + d * counter)
                if (d if (mixed or not chunks) else 0) + sum(c[1] for c in chunks) <= free:
                    break
            if ratio_mode and d:
                ratio = min(1.0, (out_const + d * counter + scheduler.retract_decode_steps * d) / (out_dec + 1))
        for c in chunks:
            budget -= c[1]
            free -= c[1]
        # new requests, first come first served (none in a step that preempted)
        if not preempted:
            while waiting and budget > 0 and len(running) < max_running:
                rid = waiting[0]
                t = need[rid]
                if t > budget:
                    if not chunked:
                        break
                    t = budget
                if admission == "as_needed":
                    if t > free:
                        break
                elif admission == "whole_sequence":
                    if reserved + isl + olen[rid] > cap:
                        break
                    reserved += isl + olen[rid]
                else:
                    left = olen[rid] - produced[rid]
                    if free - ratio * reserve_tokens() < need[rid] + ratio * (left if left < clip else clip):
                        break
                waiting.popleft()
                running[rid] = None
                state[rid] = 1
                prefilling.append(rid)
                chunks.append((rid, t, 0))
                budget -= t
                free -= t
        if len(running) > max_seen:
            max_seen = len(running)
        if chunks:
            # --- one step carrying prefill work (beside the decodes, or alone)
            dd = d if mixed else 0
            dt = prefill_ms(chunks, dd)
            if dd:
                a, b = line(dd)
                dt += a + b * (kv_const + dd * counter) / dd
            now += dt
            steps_taken += 1
            if dd:
                counter += 1
                if ratio_mode:
                    ratio = ratio - r_decay if ratio - r_decay > r_min else r_min
            for rid, t, _ in chunks:
                computed[rid] += t
                pre_held += t
                if computed[rid] < need[rid]:
                    continue
                prefilling.remove(rid)
                pre_held -= need[rid]
                produced[rid] += 1
                if first[rid] != first[rid]:  # NaN: this request's first token
                    first[rid] = now
                state[rid] = 2
                g0[rid] = counter
                base[rid] = need[rid]
                finish[rid] = counter + (olen[rid] - produced[rid])
                heapq.heappush(heap, (finish[rid], rid))
                d += 1
                kv_const += need[rid] - counter + 1
                dec_held += need[rid] - counter
                out_const += produced[rid] - counter
                out_dec += olen[rid]
        else:
            if not d:
                raise E.NotCoveredError(
                    "the scheduler can admit no request although nothing runs (the cache or the step budget is "
                    "too small for one)", values={"isl": isl, "osl": osl, "kv_tokens": cap,
                                                  "step_tokens": budget_tokens},
                    fix="use more GPUs per rank, shorter sequences or a larger step budget")
            # --- a run of decode steps up to the next event
            n = heap[0][0] - counter  # the next completion
            if evicts:
                n_kv = (cap - used()) // d  # steps the cache has room for
                if n_kv < n:
                    n = n_kv if n_kv > 1 else 1
            kvbar = (kv_const + d * counter) / d
            a, b = line(d)
            if arrivals and not waiting:
                # the step in which the next request arrives: the smallest m with
                # m a + b (m kvbar + m (m - 1) / 2) >= gap
                gap = arrivals[0][0] - now
                if gap <= 0:
                    m = 1
                elif b > 0:
                    qb = a + b * (kvbar - 0.5)
                    m = math.ceil((-qb + math.sqrt(qb * qb + 2.0 * b * gap)) / b)
                else:
                    m = math.ceil(gap / a) if a > 0 else 1
                if m < 1:
                    m = 1
                while m > 1 and (m - 1) * a + b * ((m - 1) * kvbar + (m - 1) * (m - 2) / 2) >= gap:
                    m -= 1
                if m < n:
                    n = m
            elif ratio_mode and waiting and len(running) < max_running and n > 1:
                # SGLang: the step after which the decaying ratio admits the head of the queue
                head = waiting[0]
                left = olen[head] - produced[head]
                m = _ratio_wait(_RatioRoom(ratio, r_min, r_decay, cap - used(), d, reserve_tokens(),
                                           d if hi_out <= clip else _under_clip(heap, state, finish, counter, clip),
                                           need[head] + 0, min(left, clip)), n)
                if m < n:
                    n = m
            now += n * a + b * (n * kvbar + n * (n - 1) / 2)
            counter += n
            steps_taken += n
            if ratio_mode:
                ratio = ratio - n * r_decay if ratio - n * r_decay > r_min else r_min
        # --- completions
        while heap and heap[0][0] <= counter:
            f, rid = heapq.heappop(heap)
            if state[rid] != 2 or finish[rid] != f:
                continue  # preempted since
            state[rid] = 3
            done[rid] = now
            del running[rid]
            d -= 1
            kv_const -= base[rid] - g0[rid] + 1
            dec_held -= base[rid] - g0[rid]
            out_const -= produced[rid] - g0[rid]
            out_dec -= olen[rid]
            if admission == "whole_sequence":
                reserved -= isl + olen[rid]
            if rid < total:
                completed += 1
            if closed and created < slots:
                send[created] = now
                arrivals.append((now + delay, created))  # completions come in time order
                created += 1

    lo = workload.warmup
    sent = np.asarray(send[lo:total])
    firsts = np.asarray(first[lo:total])
    ends = np.asarray(done[lo:total])
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    window = float(ends.max() - sent.min())
    stats = {"requests": total, "measured": total - lo, "engine_steps": steps_taken, "events": events,
             "preemptions": preemptions, "max_running": max_seen, "simulated_ms": now,
             "requests_per_s": (total - lo) / window * 1000.0 if window > 0 else math.inf,
             "wall_s": elapsed, "cpu_s": cpu,
             "requests_simulated_per_s": created / cpu if cpu > 0 else math.inf}
    lengths = np.asarray(olen[lo:total])
    return Simulated(workload, scheduler, firsts - sent, (ends - firsts) / (lengths - 1), ends - sent, stats)


def _under_clip(heap: list[tuple[int, int]], state: bytearray, finish: list[int], counter: int, clip: int) -> int:
    """Decoding requests with fewer than ``clip`` tokens left (each frees one token of
    SGLang's reservation a step)."""
    return sum(1 for f, rid in heap if state[rid] == 2 and finish[rid] == f and f - counter <= clip)


@dataclass(frozen=True)
class _RatioRoom:
    """SGLang's admission margin for the head of the queue after ``k`` more decode steps: the
    free cache, less the running requests' reservation and the newcomer's. The ratio decays
    by ``decay`` a step down to ``floor``; the cache fills by one token per decoding request a
    step; the reservation falls by one token a step for each request under the clip."""

    ratio: float
    floor: float
    decay: float
    free: int
    decoding: int
    reserve: int
    under_clip: int
    need: int
    newcomer: int

    def __call__(self, k: int) -> float:
        r = max(self.floor, self.ratio - k * self.decay)
        return (self.free - self.decoding * k - r * (self.reserve - self.under_clip * k) - self.need
                - r * self.newcomer)


def _ratio_wait(margin, limit: int) -> int:
    """The first k in 1..limit where ``margin(k) >= 0`` (doubling, then bisection), else limit."""
    if limit <= 1:
        return 1
    k, prev = 1, 0
    while k < limit and margin(k) < 0:
        prev, k = k, k * 2
    if k >= limit:
        if margin(limit) < 0:
            return limit
        k = limit
    lo, hi = prev, k  # margin(lo) < 0 (or lo = 0), margin(hi) >= 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if margin(mid) >= 0:
            hi = mid
        else:
            lo = mid
    return max(hi, 1)


@dataclass(frozen=True)
class SimConstants:
    """What the simulation is run with: ``s_pre`` / ``s_dec`` scale the prefill and decode
    parts of every step, ``tau0_ms`` is the path outside the engine (as the closed form's);
    ``osl_spread`` spreads the requests' output lengths uniformly over osl x [1 - spread,
    1 + spread], which breaks the waves a deterministic closed loop locks into (docs/serving.md,
    "The simulation")."""

    s_pre: float = 1.0
    s_dec: float = 1.0
    tau0_ms: float = 0.0
    osl_spread: float = 0.0


__all__ = ["ADMISSIONS", "PERCENTILES", "Scheduler", "SimConstants", "Simulated", "StepTimes", "Workload", "simulate"]
