"""The whole model's step: every op a model runs in one forward step at a deployment's
parallelism, priced from the tables (docs/estimate.md, "Scope model").

:func:`step_cost` prices one step -- a prefill chunk, a decode batch, or both (a *mixed* step of
continuous batching) -- per attention-DP rank. Token-linear ops (GEMMs, MoE, communication,
norms) see the step's total tokens once; attention is priced per part. Each op comes from its
family's table at the version the plan chose (nearest covered version of the same backend on
the system), from the system yaml's bandwidth roofline where no table exists (norms,
activations, embedding rows: kind ``roofline``), or is ``not_covered`` with its reason, and the
total is then None: never a silent zero, never a borrow from another backend.

Plans (layer groups, versions, collective sources) are cached per database and
(model, system, backend, parallel, version, dtypes), and so is the key resolution of every
query (kernels, distributions, dtypes), so a warm step costs a few dozen grid lookups.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import errors as E
from . import limits
from .deployment import divisors, local_kv_heads, validate_tps
from .estimate import (
    COMPOSED_MLA_TABLES,
    DTYPE_COLUMNS,
    GEMM_TABLE,
    _choose_versions,
    _composes,
    _slot_tables,
    refuse_unknown_version,
    refuse_unpriced_dtypes,
)
from .families import registry as family_registry
from .families.custom_allreduce import bus_factor
from .layers import AttentionLayer, FfnLayer, ffn_schedule, layer_schedule
from .resolve import SERVED_COLUMNS, layer_kinds, serve, served_note
from .roofline import GpuSpec, bytes_of, gpu_spec
from .versions import version_key

if TYPE_CHECKING:
    from .db import Database
    from .models import ModelConfig
    from .query import Answer

#: The components every step reports, in this order; they sum to the total.
COMPONENTS = ("attention", "gemm", "moe", "communication", "other")
ROOFLINE, NOT_COVERED = "roofline", "not_covered"
#: What an op's number is: a table's answer (exact, interpolated, extrapolated), the system's
#: bandwidth roofline, or nothing (not covered, with its reason).
OP_KINDS = ("exact", "interpolated", "extrapolated", ROOFLINE, NOT_COVERED)
#: Dtype columns a caller may set besides the attention ones: the routed experts' dtype.
STEP_DTYPE_COLUMNS = (*DTYPE_COLUMNS, "moe_dtype")
#: Where a table measured several routing distributions, the one a step takes (real routers are
#: skewed; docs/estimate.md), else the next.
DISTRIBUTIONS = ("power_law_1.01", "balanced", "power_law_1.2")
#: The dtype of the communication buffers and of the unquantised GEMMs (router, logits).
ACTIVATION_DTYPE = "bfloat16"
ALLTOALL_TABLES = ("moe_a2a", "wideep_deepep_normal", "wideep_deepep_ll")
#: SMs an all-to-all's high-throughput kernels run on where the table sweeps them: DeepEP's
#: default (its low-latency kernels are stored at 0).
DEEPEP_SMS = 20
#: The moe_dtype names of kernels for one mxfp4 checkpoint (weights mxfp4; activations differ).
MXFP4_KERNELS = ("w4a16_mxfp4", "w4a8_mxfp4_mxfp8")
#: Axes along which an op's work is a sum of independent parts (docs/estimate.md).
SPLIT_AXES: dict[str, tuple[str, ...]] = {"gemm": ("m", "n"), "moe": ("num_tokens",)}
_MISS = (E.NotCoveredError, E.OutOfCoverageError, E.QueryFieldError, E.UnknownTableError)
_AXES = frozenset({"m", "n", "k", "num_tokens", "batch_size", "isl", "step", "seq_len", "message_size"})
#: How a step's notes name an MLA layer composed from its parts although module tables exist.
COMPOSED_FALLBACK = "MLA composed from its parts where the module tables cannot answer"
_SLOT_FIELDS = ("table", "system", "backend", "version", "model", "native_heads")


# --- the request ----------------------------------------------------------------------------


def _check_size(name: str, value: Any, rng: limits.Range, fix: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value not in rng:
        raise E.OptionValueError(f"{name} must be an integer in {rng.describe()}", values={name: value}, fix=fix)
    return value


@dataclass(frozen=True)
class Parallel:
    """One deployment's parallelism. GPUs of one worker = ``tp * attention_dp`` = ``moe_tp *
    moe_ep``; ``moe_tp`` left out takes the value that makes the product hold. Attention runs
    ``heads / tp`` with each attention-DP rank's batch; MoE and FFN see every DP rank's tokens."""

    tp: int = 1
    moe_tp: int | None = None
    moe_ep: int = 1
    attention_dp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "moe_ep", "attention_dp", *(("moe_tp",) if self.moe_tp is not None else ())):
            _check_size(name, getattr(self, name), limits.TP, f"pass --{name.replace('_', '-')} N")
        gpus = self.tp * self.attention_dp
        if self.moe_tp is None:
            if gpus % self.moe_ep:
                raise E.OptionValueError(
                    f"moe_ep={self.moe_ep} does not divide the worker's tp x attention_dp = {gpus} GPUs",
                    values={"tp": self.tp, "attention_dp": self.attention_dp, "moe_ep": self.moe_ep},
                    fix=f"use a moe_ep that divides {gpus}: {', '.join(map(str, divisors(gpus)))}")
            object.__setattr__(self, "moe_tp", gpus // self.moe_ep)
        elif self.moe_tp * self.moe_ep != gpus:
            raise E.OptionValueError(
                f"moe_tp x moe_ep = {self.moe_tp * self.moe_ep} must equal tp x attention_dp = {gpus} (the worker's "
                "GPUs)", values={"tp": self.tp, "attention_dp": self.attention_dp, "moe_tp": self.moe_tp,
                                 "moe_ep": self.moe_ep},
                fix=f"leave moe_tp out (it becomes {gpus // self.moe_ep if gpus % self.moe_ep == 0 else '?'}), or "
                    f"choose moe_tp and moe_ep whose product is {gpus}")

    @property
    def moe_tp_size(self) -> int:
        assert self.moe_tp is not None  # set in __post_init__
        return self.moe_tp

    @property
    def gpus(self) -> int:
        return self.tp * self.attention_dp

    def to_dict(self) -> dict[str, int]:
        return {"tp": self.tp, "moe_tp": self.moe_tp_size, "moe_ep": self.moe_ep, "attention_dp": self.attention_dp}


@dataclass
class SeqChunk:
    """Prefill part of a step: ``batch`` sequences, each ``tokens`` new tokens after ``prefix``
    cached ones (per attention-DP rank)."""

    batch: int
    tokens: int
    prefix: int = 0


@dataclass
class DecodePart:
    """Decode part of a step: ``batch`` sequences each generating one token at kv length ``kv``
    (per attention-DP rank)."""

    batch: int
    kv: int


# --- the answer -----------------------------------------------------------------------------


@dataclass
class OpCost:
    """One op of the step: its latency per occurrence and how many layers run it."""

    name: str
    component: str  # one of COMPONENTS
    table: str | None  # None: roofline
    version: str | None
    kind: str  # exact | interpolated | extrapolated | roofline | not_covered
    ms: float | None  # per occurrence; None when not covered
    count: int
    fields: dict[str, Any] = field(default_factory=dict)  # the shape asked (and the key resolved)
    reason: str | None = None  # why not covered
    backend: str | None = None  # the slot's backend (a collective library for nccl / oneccl)
    #: What graph replay removes per occurrence: the table's per-call floor above the GPU's own
    #: (``graphed`` steps only; docs/serving.md, "What a served step pays").
    isolation_ms: float | None = None
    #: Set where the table answered from another native head count (``allow_substitute``).
    substitution: str | None = None

    @property
    def total_ms(self) -> float | None:
        return None if self.ms is None else self.ms * self.count

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "component": self.component, "table": self.table, "backend": self.backend,
                "version": self.version, "kind": self.kind, "ms": self.ms, "count": self.count,
                "total_ms": self.total_ms, "fields": self.fields, "reason": self.reason,
                "isolation_ms": self.isolation_ms, "substitution": self.substitution}


@dataclass
class StepCost:
    """What one step costs. ``components`` sum the covered ops; ``total_ms`` is their sum when
    every op is covered, else None (``complete`` False, ``not_covered`` says why)."""

    model: str
    system: str
    backend: str
    parallel: Parallel
    prefill: SeqChunk | None
    decode: DecodePart | None
    ops: list[OpCost]
    versions: dict[str, str]
    notes: list[str]
    #: Of ``notes``, those saying that a table was served from the framework folder it was filed
    #: in (a misplaced library table): what every answer priced with it carries (predict).
    served_from: list[str] = field(default_factory=list)
    #: The dtypes the weights are served in beside the checkpoint's (ModelConfig.dtypes_served).
    served: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return all(op.ms is not None for op in self.ops)

    @property
    def components(self) -> dict[str, float]:
        out = dict.fromkeys(COMPONENTS, 0.0)
        for op in self.ops:
            if op.ms is not None:
                out[op.component] += op.ms * op.count
        return out

    @property
    def total_ms(self) -> float | None:
        return sum(self.components.values()) if self.complete else None

    @property
    def not_covered(self) -> list[dict[str, Any]]:
        return [{"name": op.name, "table": op.table, "reason": op.reason} for op in self.ops if op.ms is None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "system": self.system, "backend": self.backend, "parallel": self.parallel.to_dict(),
            "prefill": None if self.prefill is None else vars(self.prefill).copy(),
            "decode": None if self.decode is None else vars(self.decode).copy(),
            "total_ms": self.total_ms, "complete": self.complete, "components": self.components,
            "ops": [op.to_dict() for op in self.ops], "not_covered": self.not_covered,
            "versions": dict(self.versions), "notes": list(self.notes), "served": self.served,
        }


# --- the plan -------------------------------------------------------------------------------


def _label(indices: list[int]) -> str:
    """Layer indices as ranges: ``L0-2,5`` (more than three ranges: the first three and the count)."""
    ranges: list[str] = []
    start = prev = indices[0]
    for i in [*indices[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        ranges.append(f"{start}-{prev}" if prev > start else f"{start}")
        if i is not None:
            start = prev = i
    if len(ranges) > 3:
        return "L" + ",".join(ranges[:3]) + f",... ({len(indices)} layers)"
    return "L" + ",".join(ranges)


def _groups(items: list[Any]) -> list[tuple[Any, int, str]]:
    """Distinct items with their counts and layer labels, in order of first appearance."""
    where: dict[Any, list[int]] = {}
    for i, item in enumerate(items):
        where.setdefault(item, []).append(i)
    return [(item, len(idx), _label(idx)) for item, idx in where.items()]


def _int_field(cfg: ModelConfig, name: str) -> int:
    value = cfg.get(name, None)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise E.ModelConfigError(f"config of {cfg.model_id} has no positive {name}", file=cfg.path,
                                 fix=f"add {name} to the config")
    return value


def _shard(what: str, value: int, by: int, name: str, model: str) -> int:
    if value % by:
        good = [d for d in divisors(value) if d > 1] or [1]
        raise E.ShardError(f"{name}={by} does not divide {model}'s {what} {value}",
                           values={name: by, what.replace(" ", "_"): value},
                           fix=f"use a {name} that divides {value}: {', '.join(map(str, good[:12]))}")
    return value // by


def _is_gdn(layer: AttentionLayer, cfg: ModelConfig) -> bool:
    return not layer.covered and "linear attention" in layer.label and cfg.get("linear_num_key_heads", None) is not None


@dataclass
class _Plan:
    db: Database
    config: ModelConfig
    system: str
    backend: str
    parallel: Parallel
    gpu: GpuSpec
    attention: list[tuple[AttentionLayer, int, str]]
    ffn: list[tuple[FfnLayer, int, str]]
    layers: int
    composed: set[AttentionLayer]
    versions: dict[str, str]  # backend table -> version
    missing: dict[str, str]  # backend table -> why no version holds it
    nccl: str | None  # the system's NCCL release with a table
    dtypes: dict[str, str]
    notes: list[str]
    hidden: int
    vocab: int
    resolved: dict[tuple[Any, ...], tuple[dict[str, Any], list[str] | None]] = field(default_factory=dict)

    kinds: dict[tuple[str, str], bool] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.config.model_id

    def several_kinds(self, table: str, phase: str) -> bool:
        """Whether the model runs several layer kinds on ``table`` (the query then needs ``layer``)."""
        key = (table, phase)
        if key not in self.kinds:
            self.kinds[key] = len(layer_kinds(self.config, table, phase)) > 1
        return self.kinds[key]


_PLANS: weakref.WeakKeyDictionary[Database, dict[tuple[Any, ...], _Plan]] = weakref.WeakKeyDictionary()
_PLAN_LOCK = threading.Lock()


def _nearest(order: list[str], holding: list[str], anchor: str) -> str:
    """The version holding a table nearest the anchor in release order (ties: the newer)."""
    if anchor in holding:
        return anchor
    at = order.index(anchor)
    return min(holding, key=lambda v: (abs(order.index(v) - at), -order.index(v)))


def _plan(db: Database, model: str, system: str, backend: str, parallel: Parallel, version: str | None,
          dtypes: Mapping[str, str]) -> _Plan:
    # the weights' dtypes are the deployment's choice: the model served in them (modperf.resolve.serve)
    asked = db.models.get(model)
    cfg = serve(db.models, asked, dtypes)
    schedule = layer_schedule(cfg)
    attention = _groups(schedule.layers)
    ffn = _groups(ffn_schedule(cfg))
    hidden, vocab = _int_field(cfg, "hidden_size"), _int_field(cfg, "vocab_size")
    tp = parallel.tp
    for layer, _, _ in attention:
        if layer.covered:
            _shard("native head count", layer.native_heads, tp, "tp", model)
        elif _is_gdn(layer, cfg):
            for name in ("linear_num_key_heads", "linear_num_value_heads"):
                _shard(name.replace("_", " "), _int_field(cfg, name), tp, "tp", model)
    for block, _, _ in ffn:
        if block.kind == "dense":
            _shard("intermediate size", block.inter, tp, "tp", model)
        else:
            _shard("expert intermediate size", block.inter, parallel.moe_tp_size, "moe_tp", model)
            _shard("routed experts", block.experts, parallel.moe_ep, "moe_ep", model)
            if block.shared_inter:
                _shard("shared expert width", block.shared_inter, tp, "tp", model)
    by_version = _slot_tables(db, system, backend)
    order = sorted(by_version, key=version_key)
    refuse_unknown_version(by_version, system, backend, version)
    notes: list[str] = [asked.resolution] if asked.resolution else []
    covered = [(layer, n) for layer, n, _ in attention if layer.covered]
    composed = {layer for layer, _ in covered if _composes(layer, by_version, version, "auto")}
    instead = {layer for layer, _ in covered if layer not in composed
               and _compose_instead(db, system, backend, layer, by_version, version)}
    if instead:
        notes.append(f"{COMPOSED_FALLBACK}: {', '.join(sorted({layer.label for layer in instead}))} (the module "
                     "tables hold no bucket of the native head count, or not beside the parts)")
    composed |= instead
    attention_tables: list[str] = []
    for layer, _ in covered:
        for t in (COMPOSED_MLA_TABLES if layer in composed else (layer.context_table, layer.generation_table)):
            if t and t not in attention_tables:
                attention_tables.append(t)
    tables = [*attention_tables, GEMM_TABLE, "custom_allreduce"]
    if any(b.kind == "moe" for b, _, _ in ffn):
        tables.append("moe")
        if parallel.moe_ep > 1:
            tables += [t for t in ALLTOALL_TABLES if any(t in ts for ts in by_version.values())][:2]
    if any(_is_gdn(layer, cfg) for layer, _, _ in attention):
        tables.append("gdn")
    chosen: dict[str, str] = {}
    if version is None and attention_tables:
        try:
            chosen = _choose_versions(db, system, backend, None, attention_tables, by_version, cfg.native_heads, notes)
        except E.NotCoveredError:
            chosen = {}
    anchor = version or (chosen[attention_tables[0]] if chosen else order[-1])
    versions: dict[str, str] = {}
    missing: dict[str, str] = {}
    for t in tables:
        holding = [v for v in order if t in by_version[v]]
        if t in chosen and version is None:
            versions[t] = chosen[t]
        elif holding:
            versions[t] = _nearest(order, holding, anchor)
        else:
            missing[t] = f"no {system}/{backend} version holds a {t} table"
    borrowed = sorted({f"{t} {v}" for t, v in versions.items() if v != anchor})
    if borrowed:
        notes.append(f"anchor version {anchor}; nearest covered version for: {', '.join(borrowed)}")
    nccl_versions = sorted((str(r.version) for r in db.catalog.slots if r.system == system and r.backend == "nccl"
                            and r.table == "nccl"), key=version_key)
    gpu = gpu_spec(system)
    nccl = None
    if nccl_versions:
        nccl = gpu.nccl_version if gpu.nccl_version in nccl_versions else nccl_versions[-1]
    refuse_unpriced_dtypes(db, system, backend, versions, dtypes)
    served = served_note(cfg)
    if served is not None:
        notes.append(served)
    return _Plan(db, cfg, system, backend, parallel, gpu, attention, ffn, len(schedule.layers), composed, versions,
                 missing, nccl, {k: v for k, v in dtypes.items() if k not in SERVED_COLUMNS}, notes, hidden, vocab)


def _compose_instead(db: Database, system: str, backend: str, layer: AttentionLayer,
                     by_version: Mapping[str, set[str]], version: str | None) -> bool:
    """An MLA layer is also composed from its parts (each from the nearest version holding it)
    where no version holds its module tables together with the parts' tables, or where the
    module tables hold no bucket of the layer's native head count (Kimi-K2.5's 64 heads beside
    tables measured for DeepSeek's 128): the kernel tables are local-only, so they answer any
    native whose local count they cover."""
    if layer.family != "mla_module":
        return False
    considered = list(by_version)  # a pinned version pins what it holds; the rest come from the nearest
    if not all(any(t in by_version.get(v, set()) for v in considered) for t in COMPOSED_MLA_TABLES):
        return False
    module = [t for t in (layer.context_table, layer.generation_table) if t]
    holding = [v for v in considered if set(module) <= by_version.get(v, set())]
    if not holding:
        return True
    newest = max(holding, key=version_key)
    for table in module:
        try:
            keyed = db.table(system, backend, newest, table)
        except E.ModperfError:
            return True
        if keyed.natives and layer.native_heads not in keyed.natives:
            return True
    return False


def plan_for(db: Database, *, model: str, system: str, backend: str, parallel: Parallel, version: str | None = None,
             dtypes: Mapping[str, str] | None = None) -> _Plan:
    """The cached plan of one (model, system, backend, parallel, version, dtypes)."""
    chosen = {k: str(v) for k, v in (dtypes or {}).items() if v is not None}
    unknown = sorted(set(chosen) - set(STEP_DTYPE_COLUMNS))
    if unknown:
        raise E.UsageError(f"unknown dtype option(s) {', '.join(unknown)}", values={"dtypes": unknown},
                           fix=f"dtype options are {', '.join(STEP_DTYPE_COLUMNS)}")
    key = (model, system, backend, parallel, version, tuple(sorted(chosen.items())))
    with _PLAN_LOCK:
        plans = _PLANS.setdefault(db, {})
        plan = plans.get(key)
    if plan is None:
        plan = _plan(db, model, system, backend, parallel, version, chosen)
        with _PLAN_LOCK:
            plans[key] = plan
    return plan


# --- what isolation adds -------------------------------------------------------------------

#: A GEMM whose weight has at most this many elements has stopped getting faster with shape: at
#: a given m, such points measure the table's per-call floor (docs/serving.md).
FLOOR_ELEMENTS = 1 << 22
#: Points below the floor size a bucket needs at one m for its floor to be read there.
FLOOR_POINTS = 3


@dataclass(frozen=True)
class GemmFloors:
    """Per-call floors of one GEMM table: per bucket (its key tuple), the median latency (ms) of
    its floor-sized points at each measured m; and per m, the GPU's own floor: the lowest bucket
    floor of the table (one plain kernel, replayed in a graph)."""

    key_names: tuple[str, ...]
    buckets: dict[tuple[Any, ...], tuple[tuple[int, ...], tuple[float, ...]]]
    gpu: tuple[tuple[int, ...], tuple[float, ...]]

    @staticmethod
    def at(series: tuple[tuple[int, ...], tuple[float, ...]], m: int) -> float | None:
        """The floor at the largest measured m not above ``m`` (the smallest measured m below it)."""
        ms, floors = series
        if not ms:
            return None
        i = bisect.bisect_right(ms, m) - 1
        return floors[max(i, 0)]


_FLOORS: weakref.WeakKeyDictionary[Database, dict[tuple[str, str, str], GemmFloors]] = weakref.WeakKeyDictionary()


def gemm_floors(db: Database, system: str, backend: str, version: str) -> GemmFloors:
    """The per-call floors of a GEMM table (cached per database)."""
    key = (system, backend, version)
    with _PLAN_LOCK:
        cached = _FLOORS.setdefault(db, {}).get(key)
    if cached is not None:
        return cached
    import numpy as np

    keyed = db.table(system, backend, version, GEMM_TABLE)
    m_all, n_all, k_all = (keyed.axes[a] for a in ("m", "n", "k"))
    buckets: dict[tuple[Any, ...], tuple[tuple[int, ...], tuple[float, ...]]] = {}
    lowest: dict[int, float] = {}
    for b, bucket in enumerate(keyed.bucket_keys):
        lo, hi = int(keyed.offsets[b]), int(keyed.offsets[b + 1])
        m, lat = m_all[lo:hi].astype(np.int64), keyed.latency[lo:hi]
        small = (n_all[lo:hi].astype(np.int64) * k_all[lo:hi].astype(np.int64)) <= FLOOR_ELEMENTS
        ms, floors = [], []
        for value in np.unique(m[small]):
            pick = small & (m == value)
            if int(pick.sum()) >= FLOOR_POINTS:
                ms.append(int(value))
                floors.append(float(np.median(lat[pick])))
                lowest[int(value)] = min(lowest.get(int(value), floors[-1]), floors[-1])
        buckets[tuple(bucket)] = (tuple(ms), tuple(floors))
    gpu_m = tuple(sorted(lowest))
    out = GemmFloors(tuple(keyed.key_names), buckets, (gpu_m, tuple(lowest[m] for m in gpu_m)))
    with _PLAN_LOCK:
        _FLOORS[db][key] = out
    return out


# --- pricing --------------------------------------------------------------------------------


def _reason(exc: E.ModperfError) -> str:
    return exc.detail + (f" (fix: {exc.fix})" if exc.fix else "")


def _pick(name: str, values: list[Any], prefer: Mapping[str, Callable[[Any], bool]]) -> Any:
    if name in prefer:
        hits = [v for v in values if prefer[name](v)]
        if hits:
            return hits[0]
    if name == "distribution":
        for d in DISTRIBUTIONS:
            if d in values:
                return d
    for default in (ACTIVATION_DTYPE, "half", "default"):
        if default in values:
            return default
    return None


class _Pricer:
    """Prices the ops of one step from a plan."""

    def __init__(self, plan: _Plan, graphed: bool = False, allow_substitute: bool = False) -> None:
        self.plan = plan
        self.db = plan.db
        self.ops: list[OpCost] = []
        self.notes: list[str] = []
        self.served_from: list[str] = []
        self.graphed = graphed
        self.allow_substitute = allow_substitute

    # -- queries ---------------------------------------------------------------------------

    def _resolve(self, base: dict[str, Any], prefer: Mapping[str, Callable[[Any], bool]]
                 ) -> tuple[dict[str, Any], list[str] | None]:
        """Key columns the caller left open: a kernel list (each is tried per shape), a routing
        distribution or dtype by the documented preference; anything else stays an error."""
        fixed: dict[str, Any] = {}
        kernels: list[str] | None = None
        for _ in range(12):
            probe = {**base, **fixed, **({"kernel_source": kernels[0]} if kernels else {})}
            try:
                self.db.answer(probe, quality=False)
                break
            except E.QueryFieldError as exc:
                name, values = exc.values.get("field"), exc.values.get("values")
                if not name or not values or name in probe:
                    raise
                if name == "kernel_source":
                    kernels = [str(v) for v in values]
                    continue
                choice = _pick(name, list(values), prefer)
                if choice is None:
                    raise
                fixed[name] = choice
            except (E.NotCoveredError, E.OutOfCoverageError):
                break  # the key is resolved; this point (or this kernel) is what misses
        return fixed, kernels

    def ask(self, table: str, fields: Mapping[str, Any], **kw: Any) -> Answer:
        """One op's answer (:meth:`_ask`); where it comes from a library table served from the
        framework folder it was filed in, the step's notes say so (once)."""
        answer = self._ask(table, fields, **kw)
        if answer.notes:  # (the served file's note is among them: only then is the slot looked up)
            misplaced = self.db.ref(answer.system, answer.backend, answer.version, answer.table).misplaced
            if misplaced is not None and misplaced.note not in self.served_from:
                self.notes.append(misplaced.note)
                self.served_from.append(misplaced.note)
        return answer

    def _ask(self, table: str, fields: Mapping[str, Any], *, backend: str | None = None, version: str | None = None,
             kernels: Callable[[str], bool] | None = None, kernel_class: str = "",
             prefer: Mapping[str, Callable[[Any], bool]] | None = None) -> Answer:
        plan = self.plan
        backend = backend or plan.backend
        if version is None:
            if table in plan.missing:
                raise E.NotCoveredError(plan.missing[table], values={"table": table},
                                        fix=f"see `modperf ls --system {plan.system} --backend {backend}`")
            version = plan.versions[table]
        base = {"table": table, "system": plan.system, "backend": backend, "version": version, **fields}
        dtypes = plan.dtypes
        if dtypes:
            keyed = self.db.table(plan.system, backend, version, table)
            base.update({k: v for k, v in dtypes.items() if k in keyed.key_names and k not in fields})
        key = (backend, version, table, kernel_class,
               tuple(sorted((k, v) for k, v in base.items() if k not in _AXES)))
        resolved = plan.resolved.get(key)
        if resolved is None:
            resolved = self._resolve(base, prefer or {})
            plan.resolved[key] = resolved
        fixed, kernel_list = resolved
        if kernel_list is None:
            return self.db.answer({**base, **fixed}, quality=False)
        candidates = [k for k in kernel_list if kernels is None or kernels(k)]
        if not candidates:
            raise E.NotCoveredError(f"{table} holds no {kernel_class or 'matching'} kernel for these keys",
                                    values={"kernels": kernel_list}, fix="collect the missing kernel")
        answers: list[Answer] = []
        errors: list[tuple[str, E.ModperfError]] = []
        for ks in candidates:
            try:
                answers.append(self.db.answer({**base, **fixed, "kernel_source": ks}, quality=False, diagnose=False))
            except (E.NotCoveredError, E.OutOfCoverageError, E.QueryFieldError) as exc:
                errors.append((ks, exc))
        if not answers:  # the most specific reason, diagnosed: a point outside the grid, then a missing key
            order = (E.OutOfCoverageError, E.NotCoveredError, E.QueryFieldError)
            ks, _ = min(errors, key=lambda e: next(i for i, cls in enumerate(order) if isinstance(e[1], cls)))
            self.db.answer({**base, **fixed, "kernel_source": ks}, quality=False)
            raise AssertionError("a refused kernel answered when asked again")  # pragma: no cover
        return min(answers, key=lambda a: (a.kind == "extrapolated", a.latency_ms))

    def op(self, name: str, component: str, count: int, table: str, fields: Mapping[str, Any], **kw: Any) -> None:
        """One table op (not covered, with the reason, when its query misses). A point past the
        largest measured value of an additive axis (GEMM m or n, MoE tokens) is priced as equal
        parts that are inside the grid, summed: the work splits exactly along those axes, and
        at those sizes the kernels run at their saturated rate."""
        if count <= 0:
            return
        backend = kw.get("backend") or self.plan.backend
        try:
            a = self.ask(table, fields, **kw)
        except _MISS as exc:
            split = self._split(table, fields, exc, kw) if isinstance(exc, E.OutOfCoverageError) else None
            if split is not None:
                latency, kind, parts, axis, got = split
                shape = {**dict(fields), "split": f"{parts} x {axis}"}
                self.ops.append(OpCost(name, component, table, got, kind, latency, count, shape, None, backend))
                return
            version = kw.get("version") or self.plan.versions.get(table)
            self.ops.append(OpCost(name, component, table, version, NOT_COVERED, None, count, dict(fields),
                                   _reason(exc), backend))
            return
        shape = {k: v for k, v in a.fields.items() if k not in _SLOT_FIELDS}
        self.ops.append(OpCost(name, component, table, a.version, a.kind, a.latency_ms, count, shape, None, backend,
                               substitution=a.substitution))

    def _split(self, table: str, fields: Mapping[str, Any], exc: E.OutOfCoverageError, kw: Mapping[str, Any]
               ) -> tuple[float, str, int, str, str] | None:
        outside = exc.values.get("outside_axes") or exc.values.get("axes") or []
        axes = [a for a in SPLIT_AXES.get(table, ()) if a in fields and (not outside or a in outside)]
        if not axes:
            return None
        axis = max(axes, key=lambda a: int(fields[a]))
        for parts in (2, 4, 8, 16):
            value = int(fields[axis])
            if value < parts:
                return None
            piece = -(-value // parts)
            try:
                a = self.ask(table, {**fields, axis: piece}, **kw)
            except E.OutOfCoverageError:
                continue
            except _MISS:
                return None
            return a.latency_ms * parts, a.kind, parts, axis, str(a.version)
        return None

    def roofline(self, name: str, count: int, nbytes: float, what: str) -> None:
        if count <= 0:
            return
        self.ops.append(OpCost(name, "other", None, None, ROOFLINE, self.plan.gpu.memory_ms(nbytes), count,
                               {"bytes": nbytes, "work": what}))

    def not_covered(self, name: str, component: str, count: int, reason: str, table: str | None = None) -> None:
        self.ops.append(OpCost(name, component, table, None, NOT_COVERED, None, count, {}, reason))

    def gemm(self, name: str, count: int, m: int, n: int, k: int, *, unquantized: bool = False) -> None:
        """A GEMM of one rank's shard. Quantised projections take the checkpoint's dtype (by
        model); the router and the logits run in bfloat16."""
        if m <= 0:
            return
        fields: dict[str, Any] = {"m": m, "n": n, "k": k}
        if unquantized:
            fields["gemm_dtype"] = ACTIVATION_DTYPE
        else:
            fields["model"] = self.plan.model
        self.op(name, "gemm", count, GEMM_TABLE, fields)
        if self.graphed:
            self._replayed(self.ops[-1], m, n, k)

    def _replayed(self, op: OpCost, m: int, n: int, k: int) -> None:
        """A GEMM as a CUDA graph replays it: the table's per-call floor above the GPU's own is
        what an isolated call adds (host-side work, dynamic activation scaling); it is removed,
        never below the GPU's floor plus the weight read at the system's bandwidth, never above
        the table's answer."""
        if op.ms is None or op.version is None or "split" in op.fields:
            return
        floors = gemm_floors(self.db, self.plan.system, op.backend or self.plan.backend, op.version)
        try:
            bucket = tuple(op.fields[name] for name in floors.key_names)
        except KeyError:
            return
        series = floors.buckets.get(bucket)
        floor = GemmFloors.at(series, m) if series else None
        gpu = GemmFloors.at(floors.gpu, m)
        if floor is None or gpu is None or floor <= gpu:
            return
        dtype = str(op.fields.get("gemm_dtype") or ACTIVATION_DTYPE)
        read = gpu + self.plan.gpu.memory_ms(n * k * bytes_of(dtype)) - self.plan.gpu.mem_latency * 1e3
        replayed = min(op.ms, max(op.ms - (floor - gpu), read))
        op.isolation_ms = op.ms - replayed
        op.ms = replayed

    # -- the step --------------------------------------------------------------------------

    def step(self, prefill: SeqChunk | None, decode: DecodePart | None) -> None:
        plan, par = self.plan, self.plan.parallel
        tokens = (prefill.batch * prefill.tokens if prefill else 0) + (decode.batch if decode else 0)
        seqs = (prefill.batch if prefill else 0) + (decode.batch if decode else 0)
        hidden = plan.hidden
        for layer, count, label in plan.attention:
            self.attention(layer, count, label, prefill, decode, tokens)
        allreduce = plan.layers if par.tp > 1 else 0  # after every attention block
        for block, count, label in plan.ffn:
            if block.kind == "dense":
                self.dense(f"{label} mlp", count, block.inter, tokens)
                allreduce += count if par.tp > 1 else 0
            else:
                self.moe(block, count, label, tokens, prefill is not None)
                if par.moe_ep == 1 and par.attention_dp > 1:
                    self.collective(f"{label} moe all_gather", count, "all_gather", tokens * par.attention_dp * hidden,
                                    par.gpus)
                    self.collective(f"{label} moe reduce_scatter", count, "reduce_scatter",
                                    tokens * par.attention_dp * hidden, par.gpus)
                elif par.moe_ep == 1 and par.tp > 1:
                    allreduce += count
        if par.tp > 1:
            allreduce += 1  # the vocab-parallel embedding
        self.allreduce("tp allreduce", allreduce, tokens * hidden)
        self.roofline("embedding", 1, 4.0 * tokens * hidden, "gather T x hidden rows (bf16), write them")
        self.roofline("norms (2 per layer)", 2 * plan.layers, 8.0 * tokens * hidden,
                      "fused residual add + RMSNorm: read x and residual, write both (bf16)")
        self.roofline("final norm", 1, 4.0 * tokens * hidden, "RMSNorm: read x, write it (bf16)")
        # the vocabulary is column-parallel (padded to a multiple of tp), logits for the last token only
        self.gemm("logits", 1, seqs, -(-plan.vocab // par.tp), hidden, unquantized=True)
        if par.tp > 1:
            self.collective("logits all_gather", 1, "all_gather", seqs * plan.vocab, par.tp)

    def attention(self, layer: AttentionLayer, count: int, label: str, prefill: SeqChunk | None,
                  decode: DecodePart | None, tokens: int) -> None:
        plan = self.plan
        tp = plan.parallel.tp
        cfg = plan.config
        name = f"{label} {'gdn' if _is_gdn(layer, cfg) else layer.kind}"
        if not layer.covered:
            if _is_gdn(layer, cfg):
                self.gdn(name, count, prefill, decode, tokens)
            else:
                self.not_covered(f"{name} attention", "attention", count,
                                 f"{layer.label}: {layer.note or 'no table measures this layer kind'}")
            return
        if layer in plan.composed:
            self.composed_mla(name, layer, count, prefill, decode, tokens)
            return
        family = family_registry()[layer.family or ""]
        common = {"model": plan.model, "tp_size": tp}
        for phase, part in (("context", prefill), ("generation", decode)):
            if part is None:
                continue
            table = layer.table(phase)
            assert table is not None
            fields = dict(common)
            if plan.several_kinds(table, phase):
                fields["layer"] = layer.name
            if isinstance(part, SeqChunk):
                fields.update(batch_size=part.batch, isl=part.tokens, step=part.prefix)
            else:
                fields.update(batch_size=part.batch, step=part.kv)
            if table not in plan.missing and "beam_width" in self.db.table(
                    plan.system, plan.backend, plan.versions[table], table).key_names:
                fields["beam_width"] = 1
            if self.allow_substitute:
                fields["allow_substitute"] = True
            self.op(f"{name} attention ({'prefill' if phase == 'context' else 'decode'})", "attention", count,
                    table, fields)
        if not family.projections_in_rows:  # GQA: the kernel tables hold no projections
            local = layer.native_heads // tp
            fixed = dict(layer.fields)
            hd = int(fixed.get("head_dim") or plan.hidden // layer.native_heads)
            kv = int(fixed.get("num_key_value_heads") or cfg.kv_heads or layer.native_heads)
            try:
                local_kv = local_kv_heads(kv, tp)
            except E.ShardError as exc:
                self.not_covered(f"{name} qkv_proj", "gemm", count, _reason(exc), GEMM_TABLE)
                return
            gate = 2 if cfg.get("attn_output_gate", False) is True else 1  # Qwen3.5: a gate beside each query
            self.gemm(f"{name} qkv_proj", count, tokens, (gate * local + 2 * local_kv) * hd, plan.hidden)
            self.gemm(f"{name} o_proj", count, tokens, plan.hidden, local * hd)

    def composed_mla(self, name: str, layer: AttentionLayer, count: int, prefill: SeqChunk | None,
                     decode: DecodePart | None, tokens: int) -> None:
        """An MLA layer from its parts where no module table exists (docs/estimate.md)."""
        cfg, plan = self.plan.config, self.plan
        tp = plan.parallel.tp
        q_lora = cfg.get("q_lora_rank", None)
        kv_lora, nope = int(cfg.get("kv_lora_rank")), int(cfg.get("qk_nope_head_dim"))
        rope, v = int(cfg.get("qk_rope_head_dim")), int(cfg.get("v_head_dim"))
        local = layer.native_heads // tp
        self.gemm(f"{name} qkv_a_proj", count, tokens, (int(q_lora) if q_lora else 0) + kv_lora + rope, plan.hidden)
        self.gemm(f"{name} q_b_proj" if q_lora else f"{name} q_proj", count, tokens, local * (nope + rope),
                  int(q_lora) if q_lora else plan.hidden)
        heads = {"model": plan.model, "tp_size": tp}
        if prefill is not None:
            self.gemm(f"{name} kv_b_proj (prefill)", count, prefill.batch * (prefill.tokens + prefill.prefix),
                      local * (nope + v), kv_lora)
            self.op(f"{name} attention (prefill)", "attention", count, "context_mla",
                    {**heads, "batch_size": prefill.batch, "isl": prefill.tokens, "step": prefill.prefix})
        if decode is not None:
            self.op(f"{name} bmm_pre (decode)", "attention", count, "mla_bmm",
                    {**heads, "op_name": "mla_gen_pre", "num_tokens": decode.batch})
            self.op(f"{name} attention (decode)", "attention", count, "generation_mla",
                    {**heads, "batch_size": decode.batch, "step": decode.kv})
            self.op(f"{name} bmm_post (decode)", "attention", count, "mla_bmm",
                    {**heads, "op_name": "mla_gen_post", "num_tokens": decode.batch})
        self.gemm(f"{name} o_proj", count, tokens, plan.hidden, local * v)

    def gdn(self, name: str, count: int, prefill: SeqChunk | None, decode: DecodePart | None, tokens: int) -> None:
        """A gated-DeltaNet layer: its convolution and recurrence kernels (``gdn``, rank-local
        heads) per part, and its projections (GEMMs) over the step's tokens."""
        cfg, plan = self.plan.config, self.plan
        tp = plan.parallel.tp
        hk, hv = _int_field(cfg, "linear_num_key_heads") // tp, _int_field(cfg, "linear_num_value_heads") // tp
        dk, dv = _int_field(cfg, "linear_key_head_dim"), _int_field(cfg, "linear_value_head_dim")
        key = {"num_k_heads": hk, "head_k_dim": dk, "num_v_heads": hv, "head_v_dim": dv,
               "d_conv": _int_field(cfg, "linear_conv_kernel_dim")}
        for phase, part, seq in (("context", prefill, prefill.tokens if prefill else 0), ("generation", decode, 1)):
            if part is None:
                continue
            word = "prefill" if phase == "context" else "decode"
            fields = {**key, "phase": phase, "batch_size": part.batch, "seq_len": seq}
            self.op(f"{name} conv ({word})", "attention", count, "gdn", fields,
                    kernels=lambda k: "conv1d" in k, kernel_class="convolution")
            self.op(f"{name} recurrence ({word})", "attention", count, "gdn", fields,
                    kernels=lambda k: "conv1d" not in k, kernel_class="recurrence")
        self.gemm(f"{name} in_proj_qkvz", count, tokens, 2 * hk * dk + 2 * hv * dv, plan.hidden)
        self.gemm(f"{name} in_proj_ba", count, tokens, 2 * hv, plan.hidden)
        self.gemm(f"{name} out_proj", count, tokens, plan.hidden, hv * dv)

    def dense(self, name: str, count: int, inter: int, tokens: int) -> None:
        """A gated MLP sharded by tp: gate/up column-parallel (n = 2 inter / tp), down
        row-parallel (k = inter / tp), and the SiLU x up element-wise op between them."""
        local = inter // self.plan.parallel.tp
        self.gemm(f"{name} gate_up", count, tokens, 2 * local, self.plan.hidden)
        self.gemm(f"{name} down", count, tokens, self.plan.hidden, local)
        self.roofline(f"{name} activation", count, 6.0 * tokens * local, "SiLU(gate) x up: read 2 x inter/tp, write "
                      "inter/tp per token (bf16)")

    def moe(self, block: FfnLayer, count: int, label: str, tokens: int, has_prefill: bool) -> None:
        plan, par = self.plan, self.plan.parallel
        name = f"{label} moe"
        self.gemm(f"{name} router", count, tokens, block.experts, plan.hidden, unquantized=True)
        fields: dict[str, Any] = {
            "num_tokens": tokens * par.attention_dp, "hidden_size": block.hidden, "inter_size": block.inter,
            "topk": block.topk, "num_experts": block.experts, "moe_tp_size": par.moe_tp_size,
            "moe_ep_size": par.moe_ep}
        quant = plan.config.quantization.moe
        if quant is not None:
            fields["moe_dtype"] = quant
        self.op(f"{name} experts", "moe", count, "moe", fields)
        if self.ops[-1].ms is None and quant in MXFP4_KERNELS and quant == plan.config.checkpoint.moe:
            # an mxfp4 checkpoint runs on whichever mxfp4 kernel the backend has for the GPU
            # (activations in bf16 on Hopper, in mxfp8 on Blackwell): the weights are the same (a
            # kernel named as the deployment's choice is kept: its miss is the answer)
            missed = self.ops.pop()
            for other in MXFP4_KERNELS:
                if other != quant:
                    self.op(f"{name} experts ({other} kernel)", "moe", count, "moe", {**fields, "moe_dtype": other})
                    if self.ops[-1].ms is not None:
                        break
                    self.ops.pop()
            else:
                self.ops.append(missed)
        if block.shared_inter:
            self.dense(f"{name} shared expert", count, block.shared_inter, tokens)
        if par.moe_ep > 1:
            self.alltoall(name, count, block, tokens, has_prefill)

    def alltoall(self, name: str, count: int, block: FfnLayer, tokens: int, has_prefill: bool) -> None:
        """Dispatch and combine of one MoE layer at moe_ep > 1: each rank sends its share of the
        group's tokens (``ceil(T x dp / (moe_tp x moe_ep))``); high-throughput kernels in a step
        with prefill, low-latency ones in a decode-only step."""
        plan, par = self.plan, self.plan.parallel
        per_rank = -(-tokens * par.attention_dp // (par.moe_tp_size * par.moe_ep))
        nodes = -(-par.moe_ep // plan.gpu.gpus_per_node)
        mode = "ht" if has_prefill else "ll"
        common = {"ep_size": par.moe_ep, "node_num": nodes, "hidden_size": block.hidden, "topk": block.topk,
                  "num_experts": block.experts, "num_tokens": per_rank}
        if "moe_a2a" in plan.versions:
            table, extra = "moe_a2a", dict[str, Any]()
            prefer = {"comm_backend": (lambda v: str(v).endswith("_" + mode))}
        elif "wideep_deepep_normal" in plan.versions or "wideep_deepep_ll" in plan.versions:
            table = "wideep_deepep_normal" if mode == "ht" else "wideep_deepep_ll"
            extra, prefer = {}, {}  # one op per mode
        else:
            for phase in ("dispatch", "combine"):
                self.not_covered(f"{name} {phase}", "communication", count,
                                 f"no {plan.system}/{plan.backend} version holds an all-to-all table "
                                 f"({', '.join(ALLTOALL_TABLES)})")
            return
        version = plan.versions[table]
        if "sms" in self.db.table(plan.system, plan.backend, version, table).spec.axes:
            extra["sms"] = DEEPEP_SMS
        for phase in ("dispatch", "combine"):
            fields = {**common, **extra, "phase": phase}
            before = len(self.ops)
            # the kernel class names the mode: the resolved comm_backend is cached per class
            cls = f"{'high-throughput' if mode == 'ht' else 'low-latency'} all-to-all"
            self.op(f"{name} {phase}", "communication", count, table, fields, prefer=prefer, kernel_class=cls)
            if "sms" in extra and self.ops[-1].ms is None:  # kernels without an SM setting are stored at 0
                del self.ops[before:]
                self.op(f"{name} {phase}", "communication", count, table, {**fields, "sms": 0}, prefer=prefer,
                        kernel_class=cls)
            if self.ops[-1].ms is None:
                self._gather_scatter(name, phase, count, block, per_rank, self.ops.pop())

    def _gather_scatter(self, name: str, phase: str, count: int, block: FfnLayer, per_rank: int,
                        missed: OpCost) -> None:
        """Dispatch / combine where the all-to-all table has no bucket for this group: an NCCL
        all-to-all over the EP group in which each rank sends its tokens to their top-k
        experts' ranks (``tokens per rank x min(topk, ep) x hidden`` elements), from the
        system's NCCL table; the op says so."""
        par = self.plan.parallel
        before = len(self.ops)
        self.collective(f"{name} {phase} (nccl alltoall: {missed.table} has no bucket)", count, "alltoall",
                        per_rank * min(block.topk, par.moe_ep) * block.hidden, par.moe_ep)
        if self.ops[-1].ms is None:  # neither answers: keep the all-to-all table's reason
            del self.ops[before:]
            self.ops.append(missed)

    def allreduce(self, name: str, count: int, elements: int) -> None:
        """All-reduce over the tp group: the backend's custom all-reduce table, else the system's
        NCCL table (the op's table says which)."""
        if count <= 0 or elements <= 0:
            return
        tp = self.plan.parallel.tp
        fields = {"op_name": "all_reduce", "num_gpus": tp, "message_size": elements}
        try:
            a = self.ask("custom_allreduce", fields)
        except _MISS as exc:
            self.notes.append(f"{name}: custom_allreduce does not answer ({exc.detail}); NCCL all_reduce instead")
            self.collective(name, count, "all_reduce", elements, tp)
            return
        shape = {k: v for k, v in a.fields.items() if k not in _SLOT_FIELDS}
        self.ops.append(OpCost(name, "communication", "custom_allreduce", a.version, a.kind, a.latency_ms, count,
                               shape, None, self.plan.backend))

    def collective(self, name: str, count: int, op: str, elements: int, gpus: int) -> None:
        """A collective from the system's NCCL table (the release its yaml names, else the newest)."""
        if count <= 0 or elements <= 0:
            return
        plan = self.plan
        if plan.nccl is None:
            self.not_covered(name, "communication", count, f"{plan.system} has no nccl table", "nccl")
            return
        self.op(name, "communication", count, "nccl", {"op_name": op, "num_gpus": gpus, "message_size": elements},
                backend="nccl", version=plan.nccl)
        missed = self.ops[-1]
        if missed.ms is None and gpus > 1 and "holds no bucket" in (missed.reason or ""):
            self.ops.pop()
            self.ops.append(self._wider_group(name, count, op, elements, gpus, missed))

    def _wider_group(self, name: str, count: int, op: str, elements: int, gpus: int, missed: OpCost) -> OpCost:
        """A collective over more GPUs than the table measured (across nodes): the table's
        answer at the largest measured group below it, plus what the wider group adds by the
        ring's bandwidth share over its slowest link and one hop latency per doubling
        (docs/estimate.md)."""
        plan, gpu = self.plan, self.plan.gpu
        nbytes = 2.0 * elements  # bfloat16 activations

        def share(n: int) -> float:  # bytes each rank moves per byte of the message
            return float(bus_factor(op, n))

        for group in (g for g in (64, 32, 16, 8, 4, 2) if g < gpus):
            try:
                a = self.ask("nccl", {"op_name": op, "num_gpus": group, "message_size": elements}, backend="nccl",
                             version=plan.nccl)
            except _MISS:
                continue
            extra = max(0.0, share(gpus) * nbytes / gpu.link_bw(gpus) - share(group) * nbytes / gpu.link_bw(group))
            hops = (gpus // group - 1).bit_length() * (2 if op == "all_reduce" else 1)
            ms = a.latency_ms + (extra + hops * gpu.p2p_latency) * 1e3
            return OpCost(f"{name} (nccl {group}-GPU {op} widened to {gpus})", "communication", "nccl", a.version,
                          ROOFLINE, ms, count, {"op_name": op, "num_gpus": gpus, "measured_group": group,
                                                "message_size": elements}, None, "nccl")
        return missed


# --- the entry point ------------------------------------------------------------------------


def _validate_parts(prefill: SeqChunk | None, decode: DecodePart | None) -> None:
    if prefill is None and decode is None:
        raise E.UsageError("a step needs a prefill chunk, a decode part or both",
                           fix="pass prefill=SeqChunk(batch, tokens, prefix) and/or decode=DecodePart(batch, kv)")
    checks: list[tuple[str, Any, limits.Range]] = []
    if prefill is not None:
        checks += [("prefill.batch", prefill.batch, limits.BATCH), ("prefill.tokens", prefill.tokens, limits.TOKENS),
                   ("prefill.prefix", prefill.prefix, limits.CACHED_TOKENS)]
    if decode is not None:
        checks += [("decode.batch", decode.batch, limits.BATCH), ("decode.kv", decode.kv, limits.TOKENS)]
    for name, value, rng in checks:
        if not isinstance(value, int) or isinstance(value, bool) or value not in rng:
            raise E.UsageError(f"{name} must be an integer in {rng.describe()}", values={name: value},
                               fix=f"give {name} in {rng.describe()}")


def step_cost(db: Database, *, model: str, system: str, backend: str, parallel: Parallel, version: str | None = None,
              prefill: SeqChunk | None = None, decode: DecodePart | None = None,
              dtypes: Mapping[str, str] | None = None, graphed: bool = False,
              allow_substitute: bool = False) -> StepCost:
    """What one forward step of ``model`` costs on one attention-DP rank (module doc).
    ``graphed``: the step as a CUDA graph replays it (a decode step of a served engine): each
    GEMM without the per-call floor its isolated measurement adds (:func:`gemm_floors`).
    ``allow_substitute``: an attention module table without the model's native head count
    answers from its nearest native (at the rank's local heads, per head along the heads axis);
    each such op says so (``OpCost.substitution``)."""
    if not isinstance(parallel, Parallel):
        raise E.UsageError("parallel must be a modperf.model_step.Parallel", values={"parallel": repr(parallel)},
                           fix="pass parallel=Parallel(tp=...)")
    _validate_parts(prefill, decode)
    plan = plan_for(db, model=model, system=system, backend=backend, parallel=parallel, version=version,
                    dtypes=dtypes)
    pricer = _Pricer(plan, graphed, allow_substitute)
    pricer.step(prefill, decode)
    versions: dict[str, str] = {}
    for op in pricer.ops:
        if op.table is not None and op.version is not None:
            versions.setdefault(op.table, op.version)  # nccl / oneccl tables live under their library only
    return StepCost(plan.model, system, backend, parallel, prefill, decode, pricer.ops, versions,
                    [*plan.notes, *pricer.notes], pricer.served_from, served=plan.config.dtypes_served())


# --- estimate --scope model -----------------------------------------------------------------


@dataclass
class ModelTpEstimate:
    parallel: Parallel
    prefill: StepCost
    decode: StepCost

    def to_dict(self) -> dict[str, Any]:
        return {
            "tp": self.parallel.tp, "parallel": self.parallel.to_dict(),
            "prefill_ms": self.prefill.total_ms, "decode_ms": self.decode.total_ms,
            "prefill_components": self.prefill.components, "decode_components": self.decode.components,
            "prefill_complete": self.prefill.complete, "decode_complete": self.decode.complete,
            "prefill_ops": [op.to_dict() for op in self.prefill.ops],
            "decode_ops": [op.to_dict() for op in self.decode.ops],
            "prefill_not_covered": self.prefill.not_covered, "decode_not_covered": self.decode.not_covered,
            "versions": {**self.prefill.versions, **self.decode.versions},
        }


@dataclass
class ModelEstimate:
    model: str
    system: str
    backend: str
    isl: int
    osl: int
    batch: int
    prefix: int
    decode_kv: int
    decode_rule: str
    tps: list[ModelTpEstimate]
    notes: list[str]
    seconds: float = 0.0
    #: The dtypes the weights are served in beside the checkpoint's (ModelConfig.dtypes_served).
    served: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return all(t.prefill.complete and t.decode.complete for t in self.tps)

    def to_dict(self) -> dict[str, Any]:
        return {"scope": "model", "model": self.model, "system": self.system, "backend": self.backend,
                "isl": self.isl, "osl": self.osl, "batch": self.batch, "prefix": self.prefix,
                "decode_kv": self.decode_kv, "decode_rule": self.decode_rule, "complete": self.complete,
                "components": list(COMPONENTS), "served": self.served, "tps": [t.to_dict() for t in self.tps],
                "notes": self.notes, "seconds": round(self.seconds, 4)}


def model_estimate(db: Database, *, model: str, system: str, backend: str, tps: Iterable[int], isl: int, osl: int,
                   batch: int, prefix: int = 0, decode_kv: int | None = None, version: str | None = None,
                   dtypes: Mapping[str, str | None] | None = None, moe_tp: int | None = None, moe_ep: int = 1,
                   attention_dp: int = 1) -> ModelEstimate:
    """Per tp: a static prefill of ``batch`` x ``isl`` and one decode step at the decode kv
    length, whole model (docs/estimate.md)."""
    import time

    start = time.perf_counter()
    kv = decode_kv if decode_kv is not None else isl + osl // 2
    rule = (f"one decode step at kv length {kv} (decode_kv)" if decode_kv is not None
            else f"one decode step at kv length isl + osl // 2 = {kv}")
    chosen = {k: v for k, v in (dtypes or {}).items() if v is not None}
    results = []
    notes: list[str] = []
    for tp in validate_tps(tps):
        par = Parallel(tp=tp, moe_tp=moe_tp, moe_ep=moe_ep, attention_dp=attention_dp)
        common = dict(model=model, system=system, backend=backend, parallel=par, version=version, dtypes=chosen)
        pre = step_cost(db, prefill=SeqChunk(batch, isl, prefix), **common)  # type: ignore[arg-type]
        dec = step_cost(db, decode=DecodePart(batch, kv), **common)  # type: ignore[arg-type]
        results.append(ModelTpEstimate(par, pre, dec))
        for note in (*pre.notes, *dec.notes):
            if note not in notes:
                notes.append(note)
    return ModelEstimate(model, system, backend, isl, osl, batch, prefix, kv, rule, results, notes,
                         time.perf_counter() - start, results[0].prefill.served if results else {})


__all__ = ["COMPONENTS", "OP_KINDS", "DecodePart", "ModelEstimate", "ModelTpEstimate", "OpCost", "Parallel", "SeqChunk",
           "StepCost", "model_estimate", "plan_for", "step_cost"]
