"""The search itself: enumerate, price, count, and keep the fronts (docs/search.md).

Every deployment is priced exactly as ``modperf predict`` prices it (modperf.serving.predict): an
aggregated one by :func:`~modperf.serving.predict.price` and :func:`~modperf.serving.predict.solve`; a
disaggregated one from its two pools, each priced once by
:func:`~modperf.serving.predict.price_prefill_pool` / :func:`~modperf.serving.predict.price_decode_pool` and
combined for every split of the GPUs by :func:`~modperf.serving.predict.disagg_inputs` and the serving
model (:func:`~modperf.serving.disaggregated`) -- the same functions ``price`` and ``solve``
call, so a point's figures are predict's, value for value. The points reported (the fronts,
the best per mode and backend, the top K) are priced again through ``predict`` itself for their
provenance.
"""

from __future__ import annotations

import functools
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from ..base import errors as E
from ..base import limits
from ..data.versions import version_key
from ..model.step import Parallel, plan_for
from ..model.step_types import MXFP4_KERNELS
from ..serving import PoolMemory, disaggregated
from ..serving.predict import (
    Deployment,
    Pool,
    PoolPriced,
    Prediction,
    Served,
    constants_for,
    disagg_inputs,
    pool_memory_of,
    price,
    price_decode_pool,
    price_prefill_pool,
    served_dtypes,
    serving_of,
    solve,
    tokens_per_s_per_gpu,
)
from .launch import launch_commands
from .space import BACKENDS, BATCHES, DECODE_BATCHES, MODES, Layout, budgets, layouts, prefill_pools, worker_gpus

if TYPE_CHECKING:
    from ..query.db import Database
    from ..specs.models import ModelConfig

#: Why a deployment is left out of the space (docs/search.md): its weights and running
#: requests do not fit under the backend's memory rule; a step the tables cannot price; tp or
#: ep does not divide the model's heads or experts; a figure over the limits; the concurrency
#: does not split evenly over its ranks; it cannot carry the request rate.
REASONS = ("memory", "no_table", "shard", "over_limit", "concurrency", "rate")
#: Examples kept per reason (the first distinct messages).
EXAMPLES = 3
#: The most GPUs a search takes (the deployments of a larger one are beyond any table).
GPUS = limits.Range(1, 1024, "GPUs")
TOP = limits.Range(1, 1000, "deployments listed per mode")
_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16"}

Progress = Callable[[int, int, Any], None]
#: A deployment kept while searching: (tokens/s/GPU, tokens/s/user, TTFT, TPOT, GPUs, users,
#: backend, its Point (agg) or what makes it (disagg)); a Point is made only for those reported.
Candidate = tuple[float, float, float, float, int, int, str, Any]
_T = TypeVar("_T")


@dataclass(frozen=True)
class Limits:
    """The limits a deployment must meet: TTFT and TPOT at most these (None: no limit)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def meets(self, ttft_ms: float, tpot_ms: float) -> bool:
        return (self.ttft_ms is None or ttft_ms <= self.ttft_ms) and (self.tpot_ms is None or tpot_ms <= self.tpot_ms)

    def to_dict(self) -> dict[str, Any]:
        return {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms}


@dataclass
class Point:
    """One deployment of the space and its figures (``modperf predict``'s). An aggregated
    deployment of ``replicas`` identical replicas is predicted as one replica (``deployment``):
    its figures per GPU and per user are the replica's; ``gpus`` and ``concurrency`` are the
    whole deployment's."""

    mode: str
    backend: str
    ttft_ms: float
    tpot_ms: float
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    gpus: int
    concurrency: int
    replicas: int
    deployment: Deployment
    prediction: Prediction | None = None
    launch: list[dict[str, Any]] | None = None

    def summary(self) -> dict[str, Any]:
        """The deployment's choices in a flat form (the CSV columns)."""
        d = self.deployment
        out: dict[str, Any] = {"mode": self.mode, "backend": self.backend, "version": d.version}
        pools = [("", d.pool)] if d.mode == "agg" else [("prefill_", d.prefill), ("decode_", d.decode)]
        for prefix, pool in pools:
            assert pool is not None
            out.update({f"{prefix}tp": pool.tp, f"{prefix}attention_dp": pool.attention_dp,
                        f"{prefix}moe_tp": pool.moe_tp, f"{prefix}moe_ep": pool.moe_ep if pool.moe_tp else None,
                        f"{prefix}batch": pool.batch, f"{prefix}workers": pool.workers})
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mode": self.mode, "backend": self.backend, "ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "tokens_per_s_per_user": self.tokens_per_s_per_user,
            "concurrency": self.concurrency, "gpus": self.gpus, "replicas": self.replicas,
            "deployment": self.deployment.to_dict()}
        if self.prediction is not None:
            out["priced"] = priced_how(self.prediction)
        if self.launch is not None:
            out["launch"] = self.launch
        return out


def priced_how(p: Prediction) -> dict[str, Any]:
    """How a point was priced: the ops' kinds, the tables answered from another version than
    the anchor (substitutions), and predict's notes."""
    versions: dict[str, str] = p.provenance["versions"]
    anchor = p.deployment.version or versions.get("gemm")  # predict anchors the step at the GEMM table's version
    substitutions = [f"{t} {v}" for t, v in versions.items() if t not in ("nccl", "oneccl") and v != anchor]
    return {"kinds": p.provenance["kinds"], "versions": versions, "substitutions": substitutions,
            "notes": list(p.notes), "constants": p.serving["constants"]["source"]}


@dataclass
class Counts:
    """Deployments of one mode: enumerated, evaluated (priced), kept (in the space and under
    the limits) and left out by reason, with the first messages of each."""

    enumerated: int = 0
    evaluated: int = 0
    kept: int = 0
    left_out: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def leave_out(self, reason: str, n: int = 1, why: str | None = None) -> None:
        if n <= 0:
            return
        self.enumerated += n
        self.left_out[reason] += n
        if why is not None:
            seen = self.examples.setdefault(reason, [])
            if len(seen) < EXAMPLES and why not in seen:
                seen.append(why)

    def merge(self, other: Counts) -> None:
        self.enumerated += other.enumerated
        self.evaluated += other.evaluated
        self.kept += other.kept
        self.left_out.update(other.left_out)
        for reason, why in other.examples.items():
            seen = self.examples.setdefault(reason, [])
            seen += [w for w in why if w not in seen][:EXAMPLES - len(seen)]

    def to_dict(self) -> dict[str, Any]:
        return {"enumerated": self.enumerated, "evaluated": self.evaluated, "kept": self.kept,
                "left_out": {r: self.left_out.get(r, 0) for r in REASONS}, "examples": self.examples}


@dataclass
class SearchResult:
    """What :func:`search` returns (plain data through :meth:`to_dict`)."""

    model: str
    system: str
    gpus: int
    isl: int
    osl: int
    backends: list[str]
    modes: list[str]
    version: str | None
    limits: Limits
    concurrency: int | None
    request_rate: float | None
    dtypes: dict[str, str | None]
    fronts: dict[str, list[Point]]
    best: list[Point]
    top: dict[str, list[Point]]
    counts: dict[str, dict[str, Counts]]  # mode -> backend -> counts
    notes: list[str]
    seconds: float = 0.0
    #: Every deployment kept (in the space, under the limits), per mode: only when asked
    #: (``search(..., keep_points=True)``; it grows with the space).
    kept: dict[str, list[Point]] | None = None

    def total(self, mode: str) -> Counts:
        out = Counts()
        for c in self.counts.get(mode, {}).values():
            out.merge(c)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "system": self.system, "gpus": self.gpus, "isl": self.isl, "osl": self.osl,
            "backends": self.backends, "modes": self.modes, "version": self.version, "limits": self.limits.to_dict(),
            "concurrency": self.concurrency, "request_rate": self.request_rate, "dtypes": self.dtypes,
            "fronts": {m: [p.to_dict() for p in pts] for m, pts in self.fronts.items()},
            "best": [p.to_dict() for p in self.best],
            "top": {m: [p.to_dict() for p in pts] for m, pts in self.top.items()},
            "counts": {m: {"total": self.total(m).to_dict(), **{b: c.to_dict() for b, c in by.items()}}
                       for m, by in self.counts.items()},
            "notes": self.notes, "seconds": round(self.seconds, 3)}


# --- checking what was asked ------------------------------------------------------------------


def _positive(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise E.OptionValueError(f"{name} must be a positive number", values={name: value},
                                 fix=f"give {name} above 0")
    return float(value)


def _int(name: str, value: Any, rng: limits.Range) -> int:
    return limits.check_int(name, value, rng=rng, error=E.OptionValueError,
                            fix=f"give {name} as a whole number in {rng.describe()}")


def _backends(db: Database, system: str, backend: str, notes: list[str]) -> list[str]:
    """The backends searched: the one named (an UnknownTableError naming the nearest when the
    corpus holds none of its tables for the system), or every backend with GEMM tables there."""
    if backend not in (*BACKENDS, "all"):
        raise E.OptionValueError(f"--backend must be one of {', '.join(BACKENDS)} or all, not {E.quote(backend)}",
                                 values={"backend": backend}, fix="--backend vllm|sglang|trtllm|all")
    held = {str(r.backend) for r in db.catalog.slots if r.system == system and r.table == "gemm"}
    if backend != "all":
        if backend not in held:
            raise db.store.unknown_slot(system, backend, "(any version)", "gemm")
        return [backend]
    found = [b for b in BACKENDS if b in held]
    if not found:
        raise db.store.unknown_slot(system, "(any backend)", "(any version)", "gemm")
    missing = [b for b in BACKENDS if b not in held]
    if missing:
        notes.append(f"no tables for {', '.join(missing)} on {system}: not searched")
    return found


def _check_version(db: Database, system: str, backend: str, version: str) -> None:
    held = sorted({str(r.version) for r in db.catalog.slots if r.system == system and r.backend == backend
                   and r.table == "gemm"}, key=version_key)
    if version not in held:
        raise E.OptionValueError(f"{system}/{backend} holds no tables of version {E.quote(version)}",
                                 values={"version": version, "versions": held},
                                 fix=f"versions with GEMM tables: {', '.join(held)} (or leave --version out)")


def _measured(db: Database, system: str, backend: str, version: str, table: str, column: str) -> list[str]:
    keyed = db.table(system, backend, version, table)
    if column not in keyed.key_names:
        return []
    return [str(v) for v in db.queries.index(keyed).values.get(column, [])]


def _check_dtypes(db: Database, config: ModelConfig, system: str, backend: str, version: str | None,
                  gemm: str | None, moe: str | None, kv: str | None, has_moe: bool) -> None:
    """Refuse a dtype the backend's tables never measured for this model (OptionValueError with
    the measured ones): the served GEMM and MoE dtypes (predict.served_dtypes), the KV dtype
    among the attention tables' ``kv_cache_dtype`` values."""
    plan = plan_for(db, model=config.model_id, system=system, backend=backend, parallel=Parallel(tp=1),
                    version=version)
    own = config.quantization
    used_gemm, used_moe, _ = served_dtypes(own.gemm, own.moe, gemm, moe)
    checks: list[tuple[str, str | None, str, str]] = []
    if gemm is not None:
        checks.append(("--gemm-type", used_gemm, "gemm", "gemm_dtype"))
    if moe is not None:
        checks.append(("--moe-dtype", used_moe, "moe", "moe_dtype"))
    for flag, value, table, column in checks:
        if table not in plan.versions or value is None:
            continue
        measured = _measured(db, system, backend, plan.versions[table], table, column)
        accepted = set(measured) | ({*MXFP4_KERNELS} if set(MXFP4_KERNELS) & set(measured) else set())
        if measured and value not in accepted:
            raise E.OptionValueError(
                f"{flag} {value}: the {system}/{backend} {table} table ({plan.versions[table]}) measured no such "
                f"dtype", values={"dtype": value, "measured": measured},
                fix=f"measured: {', '.join(measured)}")
    if kv is not None:
        measured_kv: set[str] = set()
        for table, v in plan.versions.items():
            if table in ("gemm", "moe", "custom_allreduce", "nccl") or table.startswith(("moe_", "wideep_deepep")):
                continue
            measured_kv.update(_measured(db, system, backend, v, table, "kv_cache_dtype"))
        if measured_kv and kv not in measured_kv:
            raise E.OptionValueError(
                f"--kv-cache-dtype {kv}: no {system}/{backend} attention table of {config.model_id} measured it",
                values={"dtype": kv, "measured": sorted(measured_kv)},
                fix=f"measured: {', '.join(sorted(measured_kv))}")


# --- the search -------------------------------------------------------------------------------


def _reason(exc: E.ModperfError) -> str:
    if isinstance(exc, E.DeploymentFitError):  # predict refuses a deployment that cannot run
        return "memory"
    if isinstance(exc, E.ShardError):
        return "shard"
    return "no_table"


def _memory(dep: Deployment, pool: Pool, served: Served, what: str = "") -> PoolMemory | str:
    """One GPU of ``pool`` under the backend's memory rule (predict's
    :func:`~modperf.serving.predict.pool_memory_of`), or why the pool cannot run (predict's
    DeploymentFitError): the deployment is then left out for memory."""
    try:
        return pool_memory_of(dep, pool, served, what)
    except E.DeploymentFitError as exc:
        return exc.detail[:200]


def _answered(value: float | None) -> float:
    """A figure predict leaves None only for a disaggregated deployment without worker counts
    (TPOT only); every deployment searched names them, so it is always answered."""
    assert value is not None
    return value


def _pool(layout: Layout, batch: int | None, workers: int = 1) -> Pool:
    return Pool(tp=layout.tp, attention_dp=layout.attention_dp, moe_tp=layout.moe_tp,
                moe_ep=layout.moe_ep if layout.moe_tp is not None else 1, batch=batch, workers=workers)


class _Backend:
    """The search of one backend: its deployments' common setup and both modes."""

    def __init__(self, db: Database, base: Deployment, total: int, limits_: Limits, concurrency: int | None,
                 rate: float | None, tick: Callable[[], None]) -> None:
        self.db, self.base, self.total, self.limits = db, base, total, limits_
        self.concurrency, self.rate, self.tick = concurrency, rate, tick
        self.served = serving_of(db, replace(base, mode="agg", pool=Pool(tp=1, batch=1)))
        self.config = self.served.config
        self.has_moe = self.served.has_moe
        self.default_budget = self.served.chunk
        self._served: dict[int, Served] = {}

    def layouts(self, gpus: int) -> list[Layout]:
        return layouts(self.base.backend, gpus, self.has_moe)

    def served_at(self, budget: int) -> Served:
        """What the backend's deployments share at one token budget (its chunk)."""
        if budget not in self._served:
            self._served[budget] = replace(self.served, chunk=budget)
        return self._served[budget]

    # -- aggregated ----------------------------------------------------------------------

    def aggregated(self, counts: Counts) -> list[Candidate]:
        dep0 = replace(self.base, mode="agg", pool=Pool(tp=1, batch=1))
        constants, source = constants_for(dep0)
        kept: list[Candidate] = []
        for g in worker_gpus(self.total):
            for layout in self.layouts(g):
                for budget in budgets(self.default_budget):
                    kept += self._agg_layout(layout, budget, counts, constants, source)
                self.tick()
        return kept

    def _agg_layout(self, layout: Layout, budget: int, counts: Counts, constants: Any, source: str
                    ) -> list[Candidate]:
        g = layout.gpus
        most = self.total // g
        cache: dict[int, Prediction | tuple[str, str]] = {}
        base = replace(self.base, mode="agg", token_budget=budget)
        served = self.served_at(budget)
        where = f"{layout.label()} budget {budget}"
        room = _memory(base, _pool(layout, None), served)

        def at(batch: int) -> Prediction | tuple[str, str]:
            if batch not in cache:
                if isinstance(room, str):
                    cache[batch] = ("memory", f"{where}: {room}")
                elif batch > room.max_running:
                    cache[batch] = ("memory", f"{where} batch {batch}: {room.max_running} request(s) of "
                                              f"{room.reserved_tokens} tokens fit per GPU ({room.weights / 2**30:.1f} "
                                              f"GiB of weights, {room.budget / 2**30:.1f} GiB KV budget)")
                else:
                    dep = replace(base, pool=_pool(layout, batch))
                    try:
                        cache[batch] = solve(price(self.db, dep, served), constants, source)
                    except E.ModperfError as exc:
                        cache[batch] = (_reason(exc), f"{where}: {exc.detail[:160]}")
            return cache[batch]

        plans: list[tuple[int, int]] = []  # (replicas, batch per rank)
        if self.concurrency is not None:
            for r in range(1, most + 1):
                share, left = divmod(self.concurrency, r * layout.attention_dp)
                if left or share < 1:
                    counts.leave_out("concurrency", 1, f"{where} x {r}: {self.concurrency} users do not "
                                                       f"split over {r * layout.attention_dp} ranks")
                else:
                    plans.append((r, share))
        elif self.rate is not None:
            for r in range(1, most + 1):
                found = None
                for batch in BATCHES:
                    got = at(batch)
                    if not isinstance(got, Prediction):
                        break
                    cycle_ms = _answered(got.ttft_ms) + (self.base.osl - 1) * got.tpot_ms
                    if got.serving["concurrency"] * 1000.0 / cycle_ms * r >= self.rate:
                        found = batch
                        break
                if found is None:
                    first = at(BATCHES[0])
                    if isinstance(first, Prediction):
                        counts.leave_out("rate", 1, f"{where} x {r}: no batch up to the memory and table limits "
                                                    f"carries {self.rate:g} requests/s")
                    else:
                        counts.leave_out(first[0], 1, first[1])
                else:
                    plans.append((r, found))
        else:
            plans = [(most, b) for b in BATCHES]
        out: list[Candidate] = []
        for r, batch in plans:
            got = at(batch)
            if not isinstance(got, Prediction):
                counts.leave_out(got[0], 1, got[1])
                continue
            counts.enumerated += 1
            counts.evaluated += 1
            ttft, per_gpu = _answered(got.ttft_ms), _answered(got.tokens_per_s_per_gpu)
            if not self.limits.meets(ttft, got.tpot_ms):
                counts.left_out["over_limit"] += 1
                continue
            counts.kept += 1
            point = Point("agg", self.base.backend, ttft, got.tpot_ms, per_gpu,
                          got.tokens_per_s_per_user, g * r, got.serving["concurrency"] * r, r, got.deployment, got)
            out.append((point.tokens_per_s_per_gpu, point.tokens_per_s_per_user, point.ttft_ms, point.tpot_ms,
                        point.gpus, point.concurrency, self.base.backend, point))
        return out

    # -- disaggregated -------------------------------------------------------------------

    def disaggregated(self, counts: Counts) -> list[Candidate]:
        base = replace(self.base, mode="disagg")
        constants, _ = constants_for(base)
        total = self.total
        sizes = [g for g in worker_gpus(total) if g < total]  # each pool leaves the other at least a GPU
        pre: list[tuple[Layout, Pool, int, PoolPriced | tuple[str, str]]] = []
        for g in sizes:
            for layout in self.layouts(g):
                for budget, pb in prefill_pools(self.base.isl, self.default_budget):
                    at_budget = replace(base, token_budget=budget)
                    pool = _pool(layout, pb)
                    room = _memory(at_budget, pool, self.served_at(budget), "prefill")
                    got: PoolPriced | tuple[str, str]
                    if isinstance(room, str):
                        got = ("memory", f"prefill {layout.label()}: {room}")
                    elif pb > room.max_running:
                        got = ("memory", f"prefill {layout.label()} batch {pb}: {room.max_running} request(s) of "
                                         f"{room.reserved_tokens} tokens fit per GPU")
                    else:
                        try:
                            got = price_prefill_pool(self.db, replace(at_budget, prefill=pool, decode=pool),
                                                     self.served_at(budget), memory=room)
                        except E.ModperfError as exc:
                            got = (_reason(exc), f"prefill {layout.label()}: {exc.detail[:160]}")
                    pre.append((layout, pool, budget, got))
                self.tick()
        priced: dict[tuple[Layout, int], PoolPriced | tuple[str, str]] = {}
        rooms: dict[tuple[Layout, int], PoolMemory | str] = {}

        def decode(layout: Layout, batch: int, budget: int) -> PoolPriced | tuple[str, str]:
            """A decode pool: its memory at the deployment's budget (SGLang's reserve grows with
            it), its step (the same at every budget)."""
            room = rooms.get((layout, budget))
            if room is None:
                room = rooms[(layout, budget)] = _memory(replace(base, token_budget=budget), _pool(layout, None),
                                                         self.served_at(budget), "decode")
            if isinstance(room, str):
                return ("memory", f"decode {layout.label()}: {room}")
            if batch > room.max_running:
                return ("memory", f"decode {layout.label()} batch {batch}: {room.max_running} request(s) of "
                                  f"{room.reserved_tokens} tokens fit per GPU")
            key = (layout, batch)
            if key not in priced:
                pool = _pool(layout, batch)
                try:
                    priced[key] = price_decode_pool(self.db, replace(base, prefill=pool, decode=pool), self.served,
                                                    memory=room)
                except E.ModperfError as exc:
                    priced[key] = (_reason(exc), f"decode {layout.label()}: {exc.detail[:160]}")
            return priced[key]

        decode_layouts = [layout for g in sizes for layout in self.layouts(g)]
        points: list[Candidate] = []
        self.prefill_pools: list[tuple[Layout, Pool, int, PoolPriced | tuple[str, str]]] = pre
        isl, osl = self.base.isl, self.base.osl
        lim = self.limits
        for pi, (p_layout, _, budget, p_got) in enumerate(pre):
            gp, dp_p = p_layout.gpus, p_layout.attention_dp
            for d_layout in decode_layouts:
                gd, dp_d = d_layout.gpus, d_layout.attention_dp
                splits = [(pw, dw) for pw in range(1, (total - gd) // gp + 1)
                          for dw in range(1, (total - pw * gp) // gd + 1)]
                if not splits:
                    continue
                if isinstance(p_got, tuple):
                    n = len(splits) * (1 if self.concurrency is not None or self.rate is not None
                                       else len(DECODE_BATCHES))
                    counts.leave_out(p_got[0], n, p_got[1])
                    continue
                if self.concurrency is None and self.rate is None:
                    for batch in DECODE_BATCHES:
                        self._disagg_batch(pi, p_got, d_layout, batch, decode(d_layout, batch, budget), splits,
                                           constants, counts, points, gp, dp_p, gd, dp_d, isl, osl, lim)
                    continue
                for pw, dw in splits:
                    if self.concurrency is not None:
                        share, left = divmod(self.concurrency, dw * dp_d)
                        if left or share < 1:
                            counts.leave_out("concurrency", 1, f"decode {d_layout.label()} x {dw}: {self.concurrency} "
                                                               f"users do not split over {dw * dp_d} ranks")
                            continue
                        self._disagg_batch(pi, p_got, d_layout, share, decode(d_layout, share, budget), [(pw, dw)],
                                           constants, counts, points, gp, dp_p, gd, dp_d, isl, osl, lim)
                        continue
                    self._disagg_rate(pi, p_got, d_layout, functools.partial(_at_budget, decode, budget), (pw, dw),
                                      constants, counts, points, gp, dp_p, gd, dp_d, isl, osl, lim)
            self.tick()
        return points

    def point(self, c: Candidate) -> Point:
        """The Point of a disaggregated candidate (made only for the points reported)."""
        _, pi, d_layout, batch, pw, dw = c[7]
        _, p_pool, budget, _ = self.prefill_pools[pi]
        dep = replace(self.base, mode="disagg", token_budget=budget, prefill=replace(p_pool, workers=pw),
                      decode=_pool(d_layout, batch, dw))
        return Point("disagg", self.base.backend, c[2], c[3], c[0], c[1], c[4], c[5], 1, dep)

    def _disagg_batch(self, pi: int, p_got: PoolPriced, d_layout: Layout, batch: int,
                      d_got: PoolPriced | tuple[str, str], splits: Sequence[tuple[int, int]], constants: Any,
                      counts: Counts, points: list[Any], gp: int, dp_p: int, gd: int, dp_d: int, isl: int, osl: int,
                      lim: Limits) -> None:
        if isinstance(d_got, tuple):
            counts.leave_out(d_got[0], len(splits), d_got[1])
            return
        tpot_limit = lim.tpot_ms
        for pw, dw in splits:
            conc = batch * dw * dp_d
            times = disaggregated(disagg_inputs(isl, osl, conc, pw * dp_p, p_got, d_got), constants)
            counts.enumerated += 1
            counts.evaluated += 1
            if tpot_limit is not None and times.tpot_ms > tpot_limit:  # the decode pool alone sets TPOT
                n = len(splits) - splits.index((pw, dw)) - 1
                counts.left_out["over_limit"] += 1 + n
                counts.enumerated += n
                counts.evaluated += n
                return
            ttft = _answered(times.ttft_ms)
            if not lim.meets(ttft, times.tpot_ms):
                counts.left_out["over_limit"] += 1
                continue
            counts.kept += 1
            gpus = pw * gp + dw * gd
            points.append((tokens_per_s_per_gpu(conc, osl, ttft, times.tpot_ms, gpus), 1000.0 / times.tpot_ms,
                           ttft, times.tpot_ms, gpus, conc, self.base.backend,
                           (self, pi, d_layout, batch, pw, dw)))

    def _disagg_rate(self, pi: int, p_got: PoolPriced, d_layout: Layout,
                     decode: Callable[[Layout, int], PoolPriced | tuple[str, str]], split: tuple[int, int],
                     constants: Any, counts: Counts, points: list[Any], gp: int, dp_p: int, gd: int, dp_d: int,
                     isl: int, osl: int, lim: Limits) -> None:
        """The smallest decode batch whose closed loop carries the request rate."""
        pw, dw = split
        assert self.rate is not None
        for batch in DECODE_BATCHES:
            d_got = decode(d_layout, batch)
            if isinstance(d_got, tuple):
                counts.leave_out(d_got[0], 1, d_got[1])
                return
            conc = batch * dw * dp_d
            times = disaggregated(disagg_inputs(isl, osl, conc, pw * dp_p, p_got, d_got), constants)
            if conc * 1000.0 / (_answered(times.ttft_ms) + (osl - 1) * times.tpot_ms) >= self.rate:
                self._disagg_batch(pi, p_got, d_layout, batch, d_got, [split], constants, counts, points, gp, dp_p,
                                   gd, dp_d, isl, osl, lim)
                return
        counts.leave_out("rate", 1, f"decode {d_layout.label()} x {dw}: no batch carries {self.rate:g} requests/s")


def _at_budget(decode: Callable[[Layout, int, int], Any], budget: int, layout: Layout, batch: int) -> Any:
    return decode(layout, batch, budget)


def _pareto(items: list[_T], figures: Callable[[_T], tuple[float, float, int]]) -> list[_T]:
    """The items no other item matches or beats on both tokens/s/GPU and tokens/s/user (of a
    tie, the one with fewer GPUs), by tokens/s/user descending; ``figures``: (tokens/s/GPU,
    tokens/s/user, GPUs) of an item."""
    keyed = sorted((-f[1], -f[0], f[2], i) for i, f in enumerate(map(figures, items)))
    out: list[_T] = []
    best = -math.inf
    for _, minus_gpu, _, i in keyed:
        if -minus_gpu > best:
            out.append(items[i])
            best = -minus_gpu
    return out


def front(points: Iterable[Point]) -> list[Point]:
    """The Pareto front of tokens/s/GPU against tokens/s/user (:func:`_pareto`)."""
    return _pareto(list(points), lambda p: (p.tokens_per_s_per_gpu, p.tokens_per_s_per_user, p.gpus))


def _candidate_figures(c: Candidate) -> tuple[float, float, int]:
    return c[0], c[1], c[4]


def _rank(cands: Iterable[Candidate]) -> list[Candidate]:
    return sorted(cands, key=lambda c: (-c[0], -c[1], c[4]))


def _point(c: Candidate) -> Point:
    payload = c[7]
    return payload if isinstance(payload, Point) else payload[0].point(c)


def search(db: Database, *, model: str, system: str, gpus: int, isl: int, osl: int, backend: str = "all",
           version: str | None = None, mode: str = "both", ttft_ms: float | None = None,
           tpot_ms: float | None = None, tokens_per_user: float | None = None, concurrency: int | None = None,
           request_rate: float | None = None, gemm_type: str | None = None, moe_dtype: str | None = None,
           kv_cache_dtype: str | None = None, top: int = 5, launch: bool = False,
           progress: Progress | None = None, keep_points: bool = False) -> SearchResult:
    """Which deployment of ``model`` to run on ``gpus`` GPUs of ``system`` for requests of
    ``isl`` input and ``osl`` output tokens (docs/search.md). Every argument changes the answer
    or is refused with a typed error."""
    start = time.perf_counter()
    total = _int("--gpus", gpus, GPUS)
    isl = _int("--isl", isl, limits.TOKENS)
    osl = _int("--osl", osl, limits.Range(2, limits.TOKENS.high, "output tokens (a TPOT needs two)"))
    top = _int("--top", top, TOP)
    if mode not in (*MODES, "both"):
        raise E.OptionValueError(f"--mode must be agg, disagg or both, not {E.quote(mode)}", values={"mode": mode},
                                 fix="--mode agg|disagg|both")
    if tpot_ms is not None and tokens_per_user is not None:
        raise E.UsageError("--tpot-ms and --tokens-per-user say the same limit: give one",
                           values={"tpot_ms": tpot_ms, "tokens_per_user": tokens_per_user},
                           fix="--tokens-per-user T is --tpot-ms 1000/T")
    if concurrency is not None and request_rate is not None:
        raise E.UsageError("--concurrency and --request-rate each fix the load: give one",
                           values={"concurrency": concurrency, "request_rate": request_rate},
                           fix="--concurrency C (closed-loop users) or --request-rate R (requests per second)")
    ttft = _positive("--ttft-ms", ttft_ms)
    tpot = _positive("--tpot-ms", tpot_ms)
    per_user = _positive("--tokens-per-user", tokens_per_user)
    if per_user is not None:
        tpot = 1000.0 / per_user
    if concurrency is not None:
        concurrency = _int("--concurrency", concurrency, limits.BATCH)
    rate = _positive("--request-rate", request_rate)
    if version is not None and backend == "all":
        raise E.UsageError("--version names one backend's release: give --backend too",
                           values={"version": version}, fix="e.g. --backend vllm --version 0.24.0")
    notes: list[str] = []
    backends = _backends(db, system, backend, notes)
    if version is not None:
        _check_version(db, system, backends[0], version)
    gemm = _DTYPE_NAMES.get(gemm_type, gemm_type) if gemm_type else None
    moe = _DTYPE_NAMES.get(moe_dtype, moe_dtype) if moe_dtype else None
    kv = _DTYPE_NAMES.get(kv_cache_dtype, kv_cache_dtype) if kv_cache_dtype else None
    modes = list(MODES) if mode == "both" else [mode]
    lim = Limits(ttft, tpot)
    db.models.get(model)  # an unknown model: UnknownModelError with the fix, before anything else
    engine = db.queries
    sink, engine.plans = engine.plans, None  # restored below
    try:
        return _search(db, model, system, total, isl, osl, backend, version, modes, lim, concurrency, rate, gemm, moe,
                       kv, top, launch, progress, notes, backends, start, keep_points)
    finally:
        engine.plans = sink


def _search(db: Database, model: str, system: str, total: int, isl: int, osl: int, backend: str,
            version: str | None, modes: list[str], lim: Limits, concurrency: int | None, rate: float | None,
            gemm: str | None, moe: str | None, kv: str | None, top: int, launch: bool, progress: Progress | None,
            notes: list[str], backends: list[str], start: float, keep_points: bool) -> SearchResult:
    """:func:`search` past its checks, with the query engine's plan persistence off: a search
    asks thousands of one-off step shapes, and persisting each group's plan (each write walks
    the cache folder to bound it) would cost more than the search itself."""
    searched: list[_Backend] = []
    done = [0]
    steps = [0]

    def tick() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], max(steps[0], done[0]), None)

    for b in backends:
        base = Deployment(model=model, system=system, backend=b, mode="agg", isl=isl, osl=osl, version=version,
                          gemm_quant=gemm, moe_quant=moe, kv_cache_dtype=kv)
        searcher = _Backend(db, base, total, lim, concurrency, rate, tick)  # a dtype predict refuses: its error
        try:
            _check_dtypes(db, searcher.config, system, b, version, gemm, moe, kv, searcher.has_moe)
        except E.OptionValueError as exc:
            if backend != "all":
                raise
            notes.append(f"{b}: {exc.detail} ({exc.fix}): not searched")
            continue
        searched.append(searcher)
        if "agg" in modes:  # a tick per aggregated layout, per prefill layout and per prefill pool
            steps[0] += sum(len(searcher.layouts(g)) for g in worker_gpus(total))
        if "disagg" in modes:
            per_layout = 1 + len(prefill_pools(isl, searcher.default_budget))
            steps[0] += sum(len(searcher.layouts(g)) for g in worker_gpus(total) if g < total) * per_layout
    if not searched:
        raise E.OptionValueError("no backend measured the dtypes asked", values={"notes": notes},
                                 fix="; ".join(notes) or "change the dtypes")
    counts: dict[str, dict[str, Counts]] = {m: {} for m in modes}
    kept: dict[str, list[Candidate]] = {m: [] for m in modes}
    for s in searched:
        for m in modes:
            c = counts[m].setdefault(s.base.backend, Counts())
            kept[m] += s.aggregated(c) if m == "agg" else s.disaggregated(c)
    made: dict[int, Point] = {}

    def point(c: Candidate) -> Point:
        if id(c) not in made:
            made[id(c)] = _point(c)
        return made[id(c)]

    fronts = {m: [point(c) for c in _pareto(kept[m], _candidate_figures)] for m in modes}
    tops = {m: [point(c) for c in _rank(kept[m])[:top]] for m in modes}
    best: list[Point] = []
    for m in modes:
        for s in searched:
            ranked = _rank(c for c in kept[m] if c[6] == s.base.backend)
            if ranked:
                best.append(point(ranked[0]))
    everything = {m: [point(c) for c in kept[m]] for m in modes} if keep_points else None
    for p in made.values():
        if p.prediction is None:
            dep = p.deployment
            constants, source = constants_for(dep)
            p.prediction = solve(price(db, dep), constants, source)
    if launch:
        own = db.models.get(model).quantization
        for p in {id(p): p for p in [*best, *(p for ps in tops.values() for p in ps)]}.values():
            chunk = p.deployment.token_budget or next(s.default_budget for s in searched if s.base.backend == p.backend)
            p.launch = launch_commands(p.deployment, p.replicas, chunk, (own.gemm, own.moe))
    for m in modes:
        if not kept[m]:
            notes.append(f"no {m} deployment is in the space" + (" under the limits" if lim != Limits() else ""))
    own = db.models.get(model).quantization
    return SearchResult(model, system, total, isl, osl, [s.base.backend for s in searched], modes, version, lim,
                        concurrency, rate, {"gemm_type": gemm or own.gemm, "moe_dtype": moe or own.moe,
                                            "kv_cache_dtype": kv},
                        fronts, best, tops, counts, notes, time.perf_counter() - start, everything)


__all__ = ["REASONS", "Counts", "Limits", "Point", "SearchResult", "front", "priced_how", "search"]
