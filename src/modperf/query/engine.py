"""Latency queries: a partial row in, one answer out.

A query names the slot (``table``, ``system``, ``backend``, ``version``), the head identity
(``model`` -- its native from the HF config -- or ``native_heads``), the shard (``tp_size``:
local = native / tp, or ``num_heads``: the rank-local count directly) and the table's other key
columns by their own names. Rules (docs/queries.md has the full semantics):

- A field the table does not key is an error that lists the table's key columns; so is a
  missing one, except a key column for which the table holds exactly one value (the answer's
  ``fields`` echo the value used).
- Local-only tables (GQA, MLA kernel) need no head identity when ``num_heads`` is given.
- The native bucket is the exact native or a NotCoveredError listing the natives the table
  holds; ``allow_substitute=True`` takes the nearest native and the answer says which. A model
  whose module geometry differs from the model that measured its native bucket is not covered
  either (same native, different module).
- Inside the group the lookup is :class:`modperf.query.interp.Grid`: exact / interpolated /
  extrapolated, refused past the limit with OutOfCoverageError.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from ..base import errors as E
from ..base import limits
from ..data import keyed_cache
from ..data.buckets import NATIVE, KeyedTable
from ..data.families import registry
from ..data.families.base import DTYPE_KEYS, HEADS, TP, PointTest, Tier
from ..data.versions import choose_versions
from ..fast.answer import NOT_LOOKED_UP, Answer, Plan, extrapolation_of, fast_answer, quality_notes
from ..specs import roofline
from ..specs.roofline import AxisWork, gpu_spec
from ..specs.shard import local_heads
from .deployment import geometry_mismatch, nearest_native
from .interp import EXACT, EXTRAPOLATION_LIMIT, INTERPOLATED, KIND_NAMES, REFUSED, Grid, Lookup, sorted_unique

if TYPE_CHECKING:
    from ..data.loader import TableStore
    from ..fast.plans import PlanStore
    from ..specs.models import ModelConfig, ModelRegistry

SLOT_FIELDS = ("table", "system", "backend", "version")
HEAD_FIELDS = ("model", "native_heads", "tp_size", "num_heads")
OPTION_FIELDS = ("allow_substitute", "layer")
#: Dtype key columns that default to DEFAULT_DTYPE when left out and the table measured it.
DTYPE_COLUMNS = ("attn_dtype", "kv_cache_dtype", "mla_dtype", "gemm_type", "gemm_dtype")
DEFAULT_DTYPE = "bfloat16"
#: Key columns a query never names: derived from the head fields.
DERIVED_KEYS = (NATIVE, "local_num_heads")


@dataclass
class Latencies:
    """The vectorised answer: one latency (NaN where refused) and one kind code per point
    (0 exact, 1 interpolated, 2 extrapolated, -1 refused). Unpacks as ``lat, kinds``."""

    latency_ms: np.ndarray
    kind: np.ndarray
    template: Answer  # the shared part (slot, native, group, files, models, substitution)

    def __iter__(self):
        return iter((self.latency_ms, self.kind))


@dataclass
class QueryPlan(Plan):
    """Everything about a query except its numeric point, resolved once by the engine
    (:meth:`QueryEngine.resolve`) and reused: a :class:`modperf.fast.answer.Plan`, with what
    the engine needs beside (the group's key for quality notes, each lane's plan, the tables its
    resolution loaded until its first answer hands it to the plan store)."""

    grid: Grid
    template: Answer
    axis_fields: tuple[str, ...]  # query field per grid axis (heads axis -> None handled below)
    fixed: dict[str, int]  # defaulted axis values
    local: int | None  # heads coordinate when the grid has a heads axis
    findings_key: tuple[Any, ...] | None = None  # the group, for quality notes
    #: Where a lane rule picks the kernel per shape: (lane, test, reason) and each lane's plan.
    lanes: list[tuple[str, PointTest, str]] | None = None
    lane_plans: dict[str, QueryPlan] = field(default_factory=dict)
    lane_rule: str | None = None
    #: Each lane's plan with its answers labelled by the lane (lane_for), made on first use.
    lane_answers: dict[str, QueryPlan] = field(default_factory=dict, init=False, repr=False)
    #: What a single query's fast path reads per axis, in axis order: (field name, low, high,
    #: the value when the field is left out or None, the grid's offsets of the axis's lattice
    #: values: Grid.offsets_py). The heads axis reads no field: its name is None (never a
    #: field's) and its value the plan's local count.
    axis_checks: tuple[tuple[str | None, int, int, int | None, dict[int, int]], ...] = field(init=False, repr=False)
    #: (field name, point position) of the axes an answer's fields echo (all but heads).
    echoed: tuple[tuple[str, int], ...] = field(init=False, repr=False)
    #: The quality findings of the plan's group (QueryEngine.quality_found), once looked up.
    quality_found: Any = field(default=NOT_LOOKED_UP, init=False, repr=False)
    #: A plan resolved while plans are persisted: the tables its resolution loaded, until its
    #: first answer hands it to the plan store (QueryEngine.persist).
    pending: list[Any] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        checks: list[tuple[str | None, int, int, int | None, dict[int, int]]] = []
        for name, offsets in zip(self.axis_fields, self.grid.offsets_py):
            if name == HEADS:
                checks.append((None, 1, 0, None if self.local is None else int(self.local), offsets))
            else:
                rng = limits.range_of(name)
                checks.append((name, rng.low, rng.high, self.fixed.get(name), offsets))
        self.axis_checks = tuple(checks)
        self.echoed = tuple((name, i) for i, name in enumerate(self.axis_fields) if name != HEADS)
        # what an extrapolated answer holds, as its ``extrapolation`` lists it: settled with the
        # plan (the fast path and the plan store read it as a plain attribute)
        spec = gpu_spec(self.template.system)
        self.extrapolation_model = ("utilisation held against the roofline of " + spec.name
                                    + ("" if spec.from_file else " (default GPU: no spec file)"))

    def lane_for(self, point: Mapping[str, Any]) -> QueryPlan:
        """The plan of the lane the backend runs at ``point`` (axis values), its answer saying so."""
        assert self.lanes is not None
        for lane, test, reason in self.lanes:
            if test(point):
                plan = self.lane_answers.get(lane)
                if plan is None:  # once per lane (the answer's lane part is the same for every point)
                    sub = self.lane_plans[lane]
                    template = sub.template.copy(lane={"kernel_source": lane, "rule": reason})
                    plan = self.lane_answers[lane] = replace(sub, template=template)
                return plan
        raise AssertionError("lane tests cover every point")


class _PlansByNames:
    """The plan cache's entries of one tuple of field names (in order): how to read the values
    of the fields that are not interpolation axes, and the plans by (those values, their types)."""

    __slots__ = ("plans", "values_of")

    def __init__(self, values_of: Callable[[Mapping[str, Any]], tuple[Any, ...]]) -> None:
        self.values_of = values_of
        #: a plan, or the error resolving it raised (the key decides it: asked again, the same
        #: error is raised without resolving again; a whole-model step asks thousands of these)
        self.plans: dict[tuple[Any, ...], QueryPlan | E.ModperfError] = {}


@dataclass
class TableIndex:
    """Per loaded table: its groups and grids, built on first use."""

    keyed: KeyedTable
    group_names: tuple[str, ...]  # key columns that pick a group
    groups: dict[tuple[Any, ...], list[int]]
    values: dict[str, list[Any]]  # key column -> distinct values in the table
    axis_values: dict[str, list[int]]
    grids: dict[tuple[Any, ...], Grid] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def build(cls, keyed: KeyedTable) -> TableIndex:
        names = keyed.key_names
        group_cols = [i for i, n in enumerate(names) if not (heads_is_axis(keyed) and n == HEADS)]
        groups: dict[tuple[Any, ...], list[int]] = {}
        for b, key in enumerate(keyed.bucket_keys):
            groups.setdefault(tuple(key[i] for i in group_cols), []).append(b)
        values = {n: sorted({k[i] for k in keyed.bucket_keys}, key=_sort_key) for i, n in enumerate(names)}
        return cls(keyed, tuple(names[i] for i in group_cols), groups, values, _AxisValues(keyed))

    def grid(self, group: tuple[Any, ...], system: str | None) -> Grid:
        grid = self.grids.get(group)
        if grid is not None:
            return grid
        with self.lock:
            grid = self.grids.get(group)
            if grid is None:
                grid = build_grid(self, group, system)
                self.grids[group] = grid
        return grid


class _AxisValues(dict[str, list[int]]):
    """Interpolation axis -> the distinct values the table holds, sorted; each sorted on first
    use (a question giving every axis reads none)."""

    def __init__(self, keyed: KeyedTable) -> None:
        super().__init__()
        self._keyed = keyed

    def __missing__(self, axis: str) -> list[int]:
        if axis not in self._keyed.spec.axes:
            raise KeyError(axis)
        found: list[int] = sorted_unique(self._keyed.axes[axis]).tolist()
        self[axis] = found
        return found


def heads_is_axis(keyed: KeyedTable) -> bool:
    """Local heads are a grid axis, except in native-keyed tables (num_heads is the native
    there, a group key) and in tables without a head axis (GEMMs)."""
    return keyed.family.tier is not Tier.NATIVE and keyed.spec.head_axis


def _sort_key(v: Any) -> tuple[int, Any]:
    return (0, v) if isinstance(v, (int, np.integer)) else (1, str(v))


def build_grid(index: TableIndex, group: tuple[Any, ...], system: str | None, *,
               drop_point: int | np.ndarray | None = None) -> Grid:
    """The grid of one group. ``drop_point`` (a point index of the keyed table, or an array of
    them) leaves those points out: the leave-one-out benchmark predicts them from the rest."""
    keyed = index.keyed
    spec = keyed.spec
    buckets = index.groups[group]
    heads_axis = heads_is_axis(keyed)
    axes = ((HEADS,) if heads_axis else ()) + tuple(spec.axes)

    def measured() -> tuple[dict[str, np.ndarray], np.ndarray]:  # (a restored grid needs neither)
        rows = np.concatenate([np.arange(keyed.offsets[b], keyed.offsets[b + 1]) for b in buckets])
        if drop_point is not None:
            rows = rows[~np.isin(rows, drop_point)]
        points = {a: keyed.axes[a][rows] for a in spec.axes}
        if heads_axis:
            point_bucket = np.repeat(np.arange(keyed.n_buckets), np.diff(keyed.offsets))
            points[HEADS] = keyed.bucket_local[point_bucket[rows]]
        return points, keyed.latency[rows]

    key = dict(zip(index.group_names, group))
    models = sorted({m for b in buckets for m in keyed.bucket_models[b]})
    geometry = dict(keyed.model_geometry.get(models[0], ())) if models else {}
    gpu = gpu_spec(system)
    work = keyed.family.work_model(keyed.ref.table, spec.phase, key, geometry, gpu)
    native_heads = int(key[HEADS]) if not heads_axis and HEADS in key else None

    # the roofline's (batch, isl, step, heads) from grid axes: positions, or constants
    pos = {a: i for i, a in enumerate(axes)}
    fixed_heads = float(native_heads) / max(int(key[TP]), 1) if native_heads is not None and TP in key else \
        float(native_heads or 1)
    if isinstance(work, AxisWork):  # tables without a head axis: the family's row roofline
        return _grid(keyed, group, system, gpu, axes, None, measured, work.shape_seconds, drop_point)
    if "num_tokens" in pos:
        pick: tuple[int | None, int | None, int | None, int | None] = (pos["num_tokens"], None, None, pos.get(HEADS))
        constant = (1.0, 1.0, 0.0, fixed_heads)
    else:
        pick = (pos.get("batch_size"), pos.get("isl"), pos.get("step"), pos.get(HEADS))
        constant = (1.0, 1.0, 0.0, fixed_heads)
    seconds = work.seconds

    def roofline(values):  # floats or arrays, in grid axis order
        b, s, p, h = (values[i] if i is not None else c for i, c in zip(pick, constant))
        return seconds(b, s, p, h)

    return _grid(keyed, group, system, gpu, axes, HEADS if heads_axis else None, measured, roofline, drop_point)


def _grid(keyed: KeyedTable, group: tuple[Any, ...], system: str | None, gpu: Any, axes: tuple[str, ...],
          heads_axis: str | None, measured: Callable[[], tuple[dict[str, np.ndarray], np.ndarray]],
          roofline: Any, drop_point: Any) -> Grid:
    """The grid of a group's points: restored from the persisted cache where the table came
    from its entry and the grid was kept (modperf.data.keyed_cache, "Grids beside the entries"), else
    built (and kept for the next process)."""
    home = keyed.cache_home if drop_point is None else None
    if home is None:
        return Grid(axes, *measured(), roofline, heads_axis=heads_axis, limit=EXTRAPOLATION_LIMIT)
    identity = keyed_cache.grid_identity(home, group, system, gpu, axes, heads_axis, EXTRAPOLATION_LIMIT)
    parts = keyed_cache.load_grid(home, identity)
    if parts is not None:
        try:
            return Grid.restore(axes, parts, roofline, heads_axis=heads_axis, limit=EXTRAPOLATION_LIMIT)
        except (ValueError, KeyError, IndexError, TypeError):
            pass  # parts that do not fit: built again below (and the file replaced)
    grid = Grid(axes, *measured(), roofline, heads_axis=heads_axis, limit=EXTRAPOLATION_LIMIT)
    keyed_cache.store_grid(home, identity, grid.fill_parts())
    return grid


# --- field handling ---------------------------------------------------------------------


def key_columns(keyed: KeyedTable) -> list[str]:
    """The key columns a query of this table may name, in the table's order."""
    names = [n for n in keyed.key_names if n not in DERIVED_KEYS and n != HEADS and n != TP]
    return [*names, *keyed.spec.axes]


def _field_help(keyed: KeyedTable) -> str:
    tier = keyed.family.tier
    if not keyed.spec.head_axis:
        heads = "none (this table has no head axis)"
    elif tier is Tier.LOCAL:
        heads = "num_heads (or model/native_heads with tp_size)"
    else:
        heads = "model or native_heads, and tp_size or num_heads"
    return f"{keyed.ref.table} keys: {', '.join(key_columns(keyed))}; heads: {heads}"


def _as_int(name: str, value: Any, keyed: KeyedTable | None, *, minimum: int | None = None) -> int:
    """A query's integer field, strictly and inside its range (modperf.base.limits); ``minimum``
    raises the range's lower bound for a caller that needs more."""
    rng = limits.range_of(name)
    if minimum is not None and minimum > rng.low:
        rng = limits.Range(minimum, rng.high, rng.what)
    return limits.parse_int(name, value, rng=rng,
                            fix=_field_help(keyed) if keyed is not None else f"give {name} as a whole number")


def _check_names(fields: Mapping[str, Any]) -> None:
    """Field names are strings and field values scalars (a string, a number, a boolean): a
    batch line's nested lists or objects are refused here, before anything else reads them."""
    for name, value in fields.items():
        if not isinstance(name, str):
            raise E.QueryFieldError("query field names are strings", values={"field": repr(name)},
                                    fix='e.g. {"table": "...", "batch_size": 8}')
        if value is not None and not isinstance(value, (str, int, float, np.integer, np.floating)):
            raise E.QueryFieldError(
                f"field {E.quote(name)} must be a string, a number or a boolean, not a {type(value).__name__}",
                values={"field": name}, fix="give one value per field")


def _slot(fields: Mapping[str, Any]) -> tuple[str, str, str, str | None]:
    """(table, system, backend, version); a version left out is chosen later (the newest
    covering the model's native)."""
    missing = [f for f in SLOT_FIELDS[:3] if fields.get(f) in (None, "")]
    if missing:
        raise E.QueryFieldError(
            f"missing field(s) {', '.join(missing)}: a query names its table, system and backend (and may name a "
            "version)", values={"missing": missing}, fix="see `modperf ls` for the slots the data root holds")
    table, system, backend = (str(fields[f]) for f in SLOT_FIELDS[:3])
    version = fields.get("version")
    return table, system, backend, None if version in (None, "") else str(version)


@dataclass(eq=False)
class _Resolving:
    """A question on its way to a :class:`QueryPlan`: what each step of
    :meth:`QueryEngine.resolve` has settled so far."""

    fields: Mapping[str, Any]
    vector_fields: set[str]
    table: str = ""
    system: str = ""
    backend: str = ""
    version: str | None = None
    allow_substitute: bool = False
    notes: list[str] = field(default_factory=list)
    # the head identity
    model: Any = None
    config: ModelConfig | None = None
    native_q: int | None = None
    version_note: str | None = None
    # the table
    keyed: Any = None  # KeyedTable
    index: Any = None  # TableIndex
    # the shard and what the model fixes
    tp_v: int | None = None
    heads_v: int | None = None
    layer_native: int | None = None
    local: int | None = None
    merged: dict[str, Any] = field(default_factory=dict)
    derived: dict[str, str] = field(default_factory=dict)
    # the key columns and axes
    resolved: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, str] = field(default_factory=dict)
    lane_options: list[str] | None = None
    fixed: dict[str, int] = field(default_factory=dict)
    axis_fields: list[str] = field(default_factory=list)
    # the bucket
    requested_native: int | None = None
    used_native: int | None = None
    group: tuple[Any, ...] = ()
    models: tuple[str, ...] = ()
    substitution: str | None = None
    substituted_from: int | None = None

    def __post_init__(self) -> None:
        self.table, self.system, self.backend, self.version = _slot(self.fields)
        self.allow_substitute = limits.parse_bool("allow_substitute", self.fields.get("allow_substitute", False))


class QueryEngine:
    """Resolves queries against a table store and a model registry; caches table indexes and
    resolved plans."""

    #: Plans kept for repeated non-numeric parts (a sweep over batch/isl reuses one plan).
    PLAN_CACHE = 4096
    #: Tables of at most this many points have their quality notes assessed whole, once (every
    #: table of the corpus: about 0.1 s for one of 200k points); a larger one, group by group
    #: as queries reach them (a 20M-point table's whole assessment takes seconds and GiBs).
    QUALITY_WHOLE_POINTS = 2_000_000

    def __init__(self, store: TableStore, models: ModelRegistry, *, annotate_quality: bool = True,
                 plans: PlanStore | None = None) -> None:
        self.store = store
        self.models = models
        #: Whether single answers list the quality findings on the points they stand on.
        self.annotate_quality = annotate_quality
        self._indexes: dict[Any, TableIndex] = {}
        #: per tuple of field names (in order), the plans of the values of its other fields
        self._plan_cache: dict[tuple[Any, ...], _PlansByNames] = {}
        self._n_plans = 0  # plans held (at most PLAN_CACHE)
        self._many_plans: dict[tuple[Any, ...], QueryPlan] = {}
        self._quality_groups: dict[tuple[Any, ...], Any] = {}
        self._quality_index: dict[Any, dict[tuple[Any, ...], dict[tuple[Any, ...], list[dict[str, Any]]]]] = {}
        self._lock = threading.Lock()
        #: Called with (fields, plan, the tables it depends on, its quality state) after the first
        #: answer of each single-query plan this engine resolves (modperf.fast.plans persists it).
        #: Where each plan is persisted after its first answer (modperf.fast.plans), or None.
        self.plans = plans

    def index(self, keyed: KeyedTable) -> TableIndex:
        key = (keyed.ref.path, keyed.ref.slot)
        index = self._indexes.get(key)
        if index is None or (index.keyed is not keyed and index.keyed.ref != keyed.ref):
            index = TableIndex.build(keyed)
            with self._lock:
                self._indexes[key] = index
        return index

    # -- single queries ------------------------------------------------------------------

    def query(self, fields: Mapping[str, Any], *, quality: bool | None = None, diagnose: bool = True) -> Answer:
        """One answer; ``quality`` (default: the engine's ``annotate_quality``) lists the quality
        findings on the measured points it stands on. ``diagnose=False`` refuses a point outside
        the grid without searching for the nearest measured points (a caller trying several
        kernels asks again, diagnosed, only when every one refuses)."""
        asked = self.plan(fields)
        found = fast_answer(asked, fields)
        if found is None:  # a value to parse, or a point to refuse: the reference path
            return self.answer_of(asked, fields, quality=quality, diagnose=diagnose)
        answer, plan, point = found
        values = answer.__dict__
        exact_hit = values["kind"] == "exact"
        if self.annotate_quality if quality is None else quality:
            found_quality = plan.quality_found
            if found_quality is NOT_LOOKED_UP:
                found_quality = plan.quality_found = self.quality_found(plan)
            if found_quality is not None:
                values["quality"] = quality_notes(plan, found_quality, point, exact_hit)
        if asked.pending is not None:
            self.persist(asked, fields)
        return answer

    def persist(self, plan: QueryPlan, fields: Mapping[str, Any]) -> None:
        """Hand a plan to the plan store after its first answer (:meth:`modperf.fast.plans.PlanStore.persist`),
        with every table it depends on: those its resolution loaded, and where its group's
        quality notes were looked up, the files they compare it with; its quality state:
        ``"none"`` (the group has no notes), ``"notes"`` (``plan.quality_found`` holds them),
        ``"unknown"`` (nobody looked)."""
        loads, plan.pending = plan.pending, None
        if self.plans is None or loads is None:
            return
        found = plan.quality_found
        if found is NOT_LOOKED_UP:
            state = "unknown"
        else:
            with self.store.recording() as compared:
                self._compared(grid_keyed(self, plan))
            loads = [*loads, *compared]
            state = "none" if found is None else "notes"
        spec = roofline.spec_file(plan.template.system)
        self.plans.persist(fields, plan, loads, state, self.store.catalog.watched, AXIS_NAMES,
                           None if spec is None else str(spec))

    def answer_of(self, plan: QueryPlan, fields: Mapping[str, Any], *, quality: bool | None = None,
                  diagnose: bool = True) -> Answer:
        """The reference path of :meth:`query` for a resolved plan: the point parsed field by
        field (modperf.base.limits), the grid's general lookup, the answer a copy of the template
        (the fast path in :meth:`query` answers as this does, bit for bit; tests/test_query.py)."""
        plan_asked = plan
        point = self._point(plan, fields)
        if plan.lanes is not None:
            plan = plan.lane_for(dict(zip(plan.axis_fields, point)))
        grid = plan.grid
        found = grid.lookup(point)
        t = plan.template
        resolved = dict(t.fields)
        for name, x in zip(plan.axis_fields, point):
            if name != HEADS:
                resolved[name] = x
        if found.kind == REFUSED:
            if not diagnose:
                raise E.OutOfCoverageError(f"{t.table}: point {dict(zip(grid.axes, point))} lies outside the "
                                           "measured grid's reach", values={"native": t.native})
            raise self._refusal(plan, point, found)
        extrapolation = extrapolation_of(grid, plan.extrapolation_model, found) if found.distance > 0 else None
        # a shallow copy of the template with the point's part set (dataclasses.replace, without
        # its per-field keyword round trip)
        answer = object.__new__(Answer)
        answer.__dict__.update(t.__dict__)
        answer.latency_ms = found.latency_ms
        answer.kind = KIND_NAMES[found.kind]
        if found.heads_used:
            answer.locals_used = found.heads_used
        answer.fields = resolved
        answer.extrapolation = extrapolation
        if self.annotate_quality if quality is None else quality:
            answer.quality = self.quality_of(plan, point)
        if plan_asked.pending is not None:  # (a plan's first answer, its point parsed here)
            self.persist(plan_asked, fields)
        return answer

    def plan(self, fields: Mapping[str, Any]) -> QueryPlan:
        # the key: the field names in the order given (the same fields in another order are
        # another entry of one plan; which axis fields were given is part of it too: a plan
        # resolved without `step` carries the note that step defaulted to 0, which a query
        # giving step must not inherit), then the values of the other fields and their types
        # (0 == False and 1 == True, but only a bool is a flag: modperf.base.limits). The axis
        # values are the point, not the plan.
        names = tuple(fields)
        by_names = self._plan_cache.get(names)
        if by_names is None:
            if len(self._plan_cache) >= self.PLAN_CACHE:
                self._plan_cache.clear()
                self._n_plans = 0
            by_names = self._plan_cache[names] = _PlansByNames(_values_getter(names))
        values = by_names.values_of(fields)
        plan_key: tuple[Any, ...] | None = (values, tuple(map(type, values)))
        plans = by_names.plans
        try:
            plan = plans.get(plan_key)  # type: ignore[arg-type]
        except TypeError:  # an unhashable value: resolve without the cache
            plan, plan_key = None, None
        if plan is None:
            _check_names(fields)  # (it reads the axis values too: its refusals are the query's own, never kept)
            try:
                if self.plans is not None:
                    with self.store.recording() as loads:
                        plan = self.resolve(fields)
                    plan.pending = loads
                else:
                    plan = self.resolve(fields)
            except E.ModperfError as exc:
                plan = exc
            if plan_key is not None:
                if self._n_plans >= self.PLAN_CACHE:  # full: start over (this names' entry kept, emptied)
                    self._plan_cache.clear()
                    plans.clear()
                    self._plan_cache[names] = by_names
                    self._n_plans = 0
                plans[plan_key] = plan
                self._n_plans += 1
        if isinstance(plan, E.ModperfError):
            _check_names(fields)  # a value that is not a scalar is refused as itself, not as the key's refusal
            raise plan.with_traceback(None)
        return plan

    def _point(self, plan: QueryPlan, fields: Mapping[str, Any]) -> list[int]:
        point: list[int] = []
        for name in plan.axis_fields:
            if name == HEADS:
                assert plan.local is not None  # a single query's plan with a heads axis resolved it (_plan)
                point.append(plan.local)
                continue
            value = fields.get(name)
            if type(value) is not int or value not in limits.range_of(name):
                try:
                    value = self.axis_value(plan, name, value)
                except E.ModperfError:
                    # a value that is not a scalar is refused as a fresh resolution refuses it
                    # (the plan cache must not change a line's error: a batch's lines answer
                    # alike whether or not an earlier line resolved their plan)
                    _check_names(fields)
                    raise
            point.append(value)
        return point

    def axis_value(self, plan: QueryPlan, name: str, value: Any) -> int:
        """The point's coordinate on axis ``name`` (a field of ``plan``) for the field's value:
        an integer in its range as it is, text or another number parsed (modperf.limits), None
        the plan's fixed value; a QueryFieldError naming the field otherwise. It depends on the
        plan, the name and the value alone (a batch keeps it per value)."""
        if value is None:
            fixed = plan.fixed.get(name)
            if fixed is None:
                raise E.QueryFieldError(
                    f"missing field {name!r}", values={"field": name, "table": plan.template.table},
                    fix=_field_help(self.store.table(*_slot_of(plan.template))))
            return fixed
        if type(value) is int and value in limits.range_of(name):
            return value
        return _as_int(name, value, self.store.table(*_slot_of(plan.template)))

    def _refusal(self, plan: QueryPlan, point: list[int], found: Lookup) -> E.OutOfCoverageError:
        grid = plan.grid
        return refusal_error(plan, dict(zip(grid.axes, point)), refusal_where(found.distance),
                             grid.nearest_covered(point)[:3])

    def grid(self, fields: Mapping[str, Any]) -> Grid:
        """The grid that answers queries with these fields (the numeric axes and ``num_heads``,
        where it is a grid axis, may be left out): for diagnostics and tests."""
        vector = set(AXIS_NAMES) | {HEADS}
        plan = self.resolve(fields, vector_fields={k for k in vector if k not in fields})
        if plan.lanes is not None:
            plan = plan.lane_for({k: fields[k] for k in plan.axis_fields if k in fields})
        return plan.grid

    # -- quality notes -----------------------------------------------------------------------

    def quality_of(self, plan: QueryPlan, point: list[int]) -> list[dict[str, Any]] | None:
        """Quality findings (modperf.data.quality) on the measured points an answer stands on: the
        point itself when exact, else the measured corners of its interpolation box."""
        found = plan.quality_found
        if found is NOT_LOOKED_UP:  # (kept on the plan, as the fast path keeps it)
            found = plan.quality_found = self.quality_found(plan)
        return None if found is None else quality_notes(plan, found, point, False)

    def quality_found(self, plan: QueryPlan
                      ) -> tuple[dict[tuple[Any, ...], list[dict[str, Any]]], tuple[str, ...]] | None:
        """The quality findings of the plan's group by (heads, axis values), with the table's
        axes; None where the group has none (most groups)."""
        group = plan.findings_key
        if group is None:
            return None
        # per (file, group), kept: then an answer costs one dict lookup here
        key = (plan.template.files, group)
        try:
            return self._quality_groups[key]
        except KeyError:
            keyed = self.store.table(*_slot_of(plan.template))
            by_point = self._findings(keyed, group)
            found = (by_point, tuple(keyed.spec.axes)) if by_point else None
            with self._lock:
                self._quality_groups[key] = found
            return found

    def _findings(self, keyed: KeyedTable, group: tuple[Any, ...]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
        """Per (heads, axis values) of one group of this table: the findings of
        ``modperf check --quality`` there, with the files it is compared with (the same
        system's other versions and backends of the table). A table of at most
        ``QUALITY_WHOLE_POINTS`` points is assessed whole, once (then every group is a lookup);
        a larger one group by group (``quality.assess_buckets``: the same findings there), so a
        query on a table of millions of rows does not sort every series of the table."""
        if keyed.n_points <= self.QUALITY_WHOLE_POINTS:
            return self._whole_findings(keyed).get(group, {})
        buckets = self.index(keyed).groups.get(group)
        if not buckets:
            return {}
        from ..data.quality import Thresholds, assess_buckets

        return self._notes_by_point(keyed, assess_buckets(self._compared(keyed), buckets, Thresholds()))

    def _compared(self, keyed: KeyedTable) -> list[KeyedTable]:
        """The table first, then the files its quality is compared with."""
        siblings = [keyed]
        for ref in self.store.catalog.select(system=keyed.ref.system, table=keyed.ref.table, physical=True):
            if ref.path == keyed.ref.path:
                continue
            try:
                siblings.append(self.store.load(ref))
            except E.ModperfError:
                continue  # a sibling that does not load is not a reference
        return siblings

    @staticmethod
    def _notes_by_point(keyed: KeyedTable, findings: Iterable[Any]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
        by_point: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for f in findings:
            coords = tuple(f.point[a] for a in keyed.spec.axes)
            note = {"kind": f.kind, "point": f.point, "latency": f.latency, "reference": f.reference,
                    "ratio": f.ratio, **({"axis": f.axis} if f.axis else {}), **f.detail}
            by_point.setdefault((f.bucket.get(HEADS), coords), []).append(note)
        return by_point

    def _whole_findings(self, keyed: KeyedTable) -> dict[tuple[Any, ...], dict[tuple[Any, ...], list[dict[str, Any]]]]:
        """Per group of this table, its notes by point: the whole table assessed once."""
        key = keyed.ref.path
        cached = self._quality_index.get(key)
        if cached is not None:
            return cached
        from ..data.quality import Thresholds, assess_tables

        (mine, *_) = assess_tables(self._compared(keyed), Thresholds(), examples=0)
        names = self.index(keyed).group_names
        by_group: dict[tuple[Any, ...], list[Any]] = {}
        for f in mine.findings:
            by_group.setdefault(tuple(f.bucket.get(n) for n in names), []).append(f)
        index = {group: self._notes_by_point(keyed, found) for group, found in by_group.items()}
        with self._lock:
            self._quality_index[key] = index
        return index

    # -- vectorised ------------------------------------------------------------------------

    def query_many(self, fields: Mapping[str, Any]) -> Latencies:
        """Arrays for the numeric axes (and ``num_heads`` where it is the heads axis) of one
        table group; every other field is a scalar. Where a lane rule picks the kernel by
        shape, each point is answered from its own lane."""
        arrays = {k: v for k, v in fields.items() if isinstance(v, (np.ndarray, list, tuple))}
        scalar = {k: v for k, v in fields.items() if k not in arrays}
        # the plan depends on the scalar fields and on which fields are arrays, not on the arrays'
        # values, when every array is a numeric axis (as the single-query plan cache assumes):
        # reuse it then (a sweep calls this in a loop)
        plan_key: tuple[Any, ...] | None = None
        if arrays.keys() <= AXIS_NAMES:
            plan_key = ("many", frozenset(arrays), *[(k, type(v), v) for k, v in scalar.items()])
            try:
                plan = self._many_plans.get(plan_key)
            except TypeError:  # an unhashable value: resolve without the cache
                plan, plan_key = None, None
        else:
            plan = None
        if plan is None:
            probe = dict(scalar)
            for k, v in arrays.items():
                flat = np.asarray(v).ravel()
                first = flat[0] if flat.size else 0
                probe[k] = first.item() if isinstance(first, np.generic) else first  # parsed like any field
            plan = self.resolve(probe, vector_fields=set(arrays))
            if plan_key is not None:
                if len(self._many_plans) >= self.PLAN_CACHE:
                    self._many_plans.clear()
                self._many_plans[plan_key] = plan
        if plan.lanes is None:
            one = self._one_point(plan, arrays, scalar)
            if one is not None:
                return one
        cols: list[Any] = []
        for name in plan.axis_fields:
            if name == HEADS:
                cols.append(np.asarray(arrays[HEADS]) if HEADS in arrays else np.asarray(plan.local))
            elif name in arrays:
                col = np.asarray(arrays[name])
                rng = limits.range_of(name)
                kind = col.dtype.kind  # numbers (integer, float, complex), not booleans
                if col.size and (kind not in "iufc" or (kind not in "iu" and not np.isfinite(col).all())
                                 or col.min() < rng.low or col.max() > rng.high):
                    raise E.QueryFieldError(f"field {name!r} must hold numbers in {rng.describe()} ({rng.what})",
                                            values={"field": name, "range": [rng.low, rng.high]},
                                            fix=_field_help(grid_keyed(self, plan)))
                cols.append(col)
            elif name in scalar and scalar[name] is not None:  # one value for every point, read as a query reads it
                cols.append(np.asarray(_as_int(name, scalar[name], grid_keyed(self, plan))))
            elif name in plan.fixed:
                cols.append(np.asarray(plan.fixed[name]))
            else:
                raise E.QueryFieldError(f"missing field {name!r}", values={"field": name, "table": plan.template.table},
                                        fix=_field_help(grid_keyed(self, plan)))
        try:
            shape = np.broadcast_shapes(*[np.shape(c) for c in cols])
        except ValueError:
            shapes = {name: list(np.shape(c)) for name, c in zip(plan.axis_fields, cols) if name in arrays}
            raise E.QueryFieldError(f"the arrays' shapes {shapes} do not broadcast to one shape",
                                    values={"shapes": shapes},
                                    fix="give arrays of one shape (or of shapes numpy broadcasts, e.g. (n, 1) and "
                                        "(1, m) for a grid)") from None
        if plan.lanes is None:
            lat, kinds = plan.grid.lookup_many(cols)
            return Latencies(lat, kinds, plan.template)
        lat = np.full(shape, np.nan)
        kinds = np.full(shape, REFUSED, dtype=np.int8)
        point = {name: np.broadcast_to(c, shape) for name, c in zip(plan.axis_fields, cols)}
        for lane, test, _ in plan.lanes:
            mask = np.broadcast_to(np.asarray(test(point), dtype=bool), shape)
            if mask.any():
                sub = plan.lane_plans[lane]
                part_lat, part_kinds = sub.grid.lookup_many([np.broadcast_to(c, shape)[mask] for c in cols])
                lat[mask], kinds[mask] = part_lat, part_kinds
        return Latencies(lat, kinds, plan.template)

    @staticmethod
    def _one_point(plan: QueryPlan, arrays: Mapping[str, Any], scalar: Mapping[str, Any]) -> Latencies | None:
        """A call of one point (every array a numpy array of one integer, every other axis a
        plain int or the plan's fixed value, all inside their ranges) answered exactly or
        between measured points by the scalar lookup, in the arrays' shape; None for anything
        else (the vectorised path parses, refuses, extrapolates). For one point the vectorised
        lookup reads every axis as one value for all points, the scalar lookup's operations, so
        the latencies are the same bit for bit (tests/test_query.py compares them)."""
        point = []
        ndim = 0
        for name, low, high, fixed, _ in plan.axis_checks:
            if name is None:  # the heads axis: the plan's local count unless an array gives it
                if HEADS in arrays or fixed is None:
                    return None
                point.append(fixed)
                continue
            col = arrays.get(name)
            if col is not None:
                if type(col) is not np.ndarray or col.size != 1 or col.dtype.kind not in "iu":
                    return None
                value = col.item()
                ndim = max(ndim, col.ndim)
            else:
                value = scalar.get(name, fixed)
            if type(value) is not int or not low <= value <= high:
                return None
            point.append(value)
        found = plan.grid.lookup(point)
        if found.kind != EXACT and found.kind != INTERPOLATED:
            return None
        latency = np.array(found.latency_ms)
        kind = np.array(found.kind, dtype=np.int8)
        if ndim:
            latency, kind = latency.reshape((1,) * ndim), kind.reshape((1,) * ndim)
        return Latencies(latency, kind, plan.template)

    # -- resolution ----------------------------------------------------------------------

    def resolve(self, fields: Mapping[str, Any], vector_fields: set[str] | None = None) -> QueryPlan:
        """The plan of a question: each step below settles a part of it, in this order, and
        refuses what it cannot settle (its error is the question's answer)."""
        _check_names(fields)
        r = _Resolving(fields, vector_fields or set())
        self._head_identity(r)
        self._open_table(r)
        self._shard(r)
        self._model_fields(r)
        self._local_heads(r)
        self._key_columns(r)
        if r.lane_options is not None:
            return self._lane_plan(r)
        self._axes(r)
        self._native_bucket(r)
        return self._plan_of(r)

    def _head_identity(self, r: _Resolving) -> None:
        """The model's config and native head count, or the native given (before the table:
        the version default needs the native)."""
        fields = r.fields
        model = fields.get("model")
        config = self.models.get(str(model)) if model is not None else None
        if config is not None:
            if config.resolution:  # a name the config is not filed under: which config answered
                r.notes.append(config.resolution)
            r.native_q = config.native_heads
            given_native = fields.get("native_heads")
            if given_native is not None and _as_int("native_heads", given_native, None, minimum=1) != r.native_q:
                raise E.QueryFieldError(
                    f"native_heads={given_native} contradicts model {model} (num_attention_heads={r.native_q})",
                    values={"model": model, "native_heads": given_native}, fix="give one of model and native_heads")
        elif fields.get("native_heads") is not None:
            r.native_q = _as_int("native_heads", fields["native_heads"], None, minimum=1)
        r.model, r.config = model, config

    def _open_table(self, r: _Resolving) -> None:
        """The version (the newest holding the native where none is given), the table, its
        index; a field the table does not key is refused."""
        if r.version is None:
            r.version, r.version_note = self._default_version(r.system, r.backend, r.table, r.native_q)
        keyed = r.keyed = self.store.table(r.system, r.backend, r.version, r.table)
        r.index = self.index(keyed)
        allowed = set(SLOT_FIELDS) | set(HEAD_FIELDS) | set(OPTION_FIELDS) | set(key_columns(keyed))
        unknown = sorted(k for k in r.fields if k not in allowed)
        if unknown:
            raise E.QueryFieldError(
                f"unknown field(s) {', '.join(map(E.quote, unknown[:8]))}{' ...' if len(unknown) > 8 else ''} "
                f"for table {r.table}", values={"unknown": unknown}, fix=_field_help(keyed))

    def _shard(self, r: _Resolving) -> None:
        """``tp_size`` and ``num_heads`` as integers (num_heads only where it is not an axis
        asked as an array)."""
        tp, heads = r.fields.get("tp_size"), r.fields.get("num_heads")
        r.tp_v = _as_int("tp_size", tp, r.keyed, minimum=1) if tp is not None else None
        r.heads_v = _as_int("num_heads", heads, r.keyed, minimum=1) \
            if heads is not None and HEADS not in r.vector_fields else None

    def _model_fields(self, r: _Resolving) -> None:
        """What the model fixes (modperf.query.resolve), served in the dtypes the question
        gives; a physical key given otherwise is a contradiction."""
        fields, config, model, tp_v = r.fields, r.config, r.model, r.tp_v
        keyed, index = r.keyed, r.index
        spec = keyed.spec
        r.merged = dict(fields)
        r.layer_native = r.native_q
        if config is not None:
            layer = fields.get("layer")
            from .resolve import derive, serve  # on use: only a question naming a model derives its fields

            given = {k: v for k, v in fields.items() if k not in SLOT_FIELDS}
            keys = set(index.group_names) | set(spec.axes)
            # the dtypes the question gives are the deployment's choice: the model served in them
            config = r.config = serve(self.models, config, {k: v for k, v in fields.items() if k in keys})
            d = derive(config, keyed.family, r.table, spec.phase, keys, tp=tp_v,
                       layer=None if layer is None else str(layer), given=given)
            r.layer_native = d.native
            r.notes += d.notes
            for name, value in d.fields.items():
                if name in fields and name not in d.choices and str(fields[name]) != str(value):
                    raise E.ContradictionError(
                        f"{name}={fields[name]} contradicts {model}" + (f" at tp_size {tp_v}" if tp_v else "")
                        + f": {d.reasons[name]}",
                        values={"field": name, "given": fields[name], "derived": value, "model": model,
                                "tp_size": tp_v},
                        fix=f"leave {name} out (the model fixes it), or ask with native_heads / num_heads instead "
                            "of the model to query another shape")
                r.merged[name] = value
                r.derived[name] = d.reasons[name]
        elif r.native_q is not None and keyed.model_geometry and keyed.family.tier is not Tier.LOCAL:
            r.notes.append("native_heads names no model: the bucket's module geometry could not be checked against "
                           "yours (give model to check it)")

    def _local_heads(self, r: _Resolving) -> None:
        """The rank-local head count (native / tp, or num_heads as given), and what the
        table's keying tier requires of the head fields."""
        keyed, tier, tp_v, heads_v, native_q = r.keyed, r.keyed.family.tier, r.tp_v, r.heads_v, r.native_q
        r.local = heads_v
        if tp_v is not None:
            if r.layer_native is None:
                raise E.QueryFieldError(
                    "tp_size needs the native head count: give model or native_heads (or num_heads, the local count)",
                    values={"tp_size": tp_v}, fix=_field_help(keyed))
            local_from_tp = local_heads(r.layer_native, tp_v)
            if heads_v is not None and heads_v != local_from_tp:
                raise E.ShardError(
                    f"num_heads={heads_v} contradicts native {r.layer_native} / tp_size {tp_v} = {local_from_tp}",
                    values={"num_heads": heads_v, "native_heads": r.layer_native, "tp_size": tp_v},
                    fix="give either tp_size or num_heads")
            r.local = local_from_tp
        if tier is Tier.NATIVE and native_q is not None and tp_v is None and heads_v is not None:
            if native_q % heads_v:
                raise E.ShardError(
                    f"num_heads={heads_v} is not native {native_q} / an integer tp_size",
                    values={"num_heads": heads_v, "native_heads": native_q}, fix="give tp_size")
            r.tp_v = native_q // heads_v
        if tier is not Tier.LOCAL and native_q is None:
            raise E.QueryFieldError(
                f"{r.table} keys [native][local] ({keyed.family.title}): give model or native_heads",
                values={"table": r.table}, fix=_field_help(keyed))
        if r.local is None and HEADS not in r.vector_fields and keyed.spec.head_axis:
            raise E.QueryFieldError(
                "missing the shard: give tp_size (local = native / tp) or num_heads (rank-local)",
                values={"table": r.table}, fix=_field_help(keyed))
        if tier is Tier.NATIVE and r.tp_v is None:
            raise E.QueryFieldError(
                f"{r.table} is native-keyed by contract and keys tp_size: give tp_size",
                values={"table": r.table}, fix=_field_help(keyed))

    def _key_columns(self, r: _Resolving) -> None:
        """The table's other key columns: as given (or derived); a left-out one filled where
        everything known leaves the table one value, a dtype from the documented default
        (bfloat16 where measured), the kernel of a table whose backend picks it by shape from
        its lane rule (``r.lane_options``, per point). Otherwise the question is refused with
        the values it could take."""
        keyed, index, tier, native_q = r.keyed, r.index, r.keyed.family.tier, r.native_q
        spec, table = keyed.spec, r.table
        keys_native = tier is not Tier.LOCAL
        resolved = r.resolved
        categorical = set(spec.categorical)
        missing: list[str] = []
        for name in index.group_names:
            if name == NATIVE or (name == HEADS and tier is Tier.NATIVE):
                continue
            if name == TP:
                resolved[name] = r.tp_v
            elif name == "local_num_heads":
                resolved[name] = r.local
            elif name in r.merged:
                resolved[name] = str(r.merged[name]) if name in categorical else _as_int(name, r.merged[name], keyed)
            else:
                missing.append(name)
        if not missing:
            return
        positions = {n: i for i, n in enumerate(index.group_names)}
        known = dict(resolved)
        if keys_native and native_q is not None:
            known[NATIVE if tier is Tier.NATIVE_LOCAL else HEADS] = native_q
        matching = [g for g in index.groups
                    if all(g[positions[n]] == v for n, v in known.items() if n in positions)]
        if not matching and keys_native and native_q is not None:
            # the native is not measured with these keys: narrow without it, so that the
            # native resolution names the natives present (or substitutes)
            known.pop(NATIVE if tier is Tier.NATIVE_LOCAL else HEADS)
            matching = [g for g in index.groups
                        if all(g[positions[n]] == v for n, v in known.items() if n in positions)]
        if not matching:
            given_key = {n: v for n, v in known.items() if n in positions}
            near = sorted(index.groups, key=lambda g: (sum(g[positions[n]] != v for n, v in given_key.items()),
                                                       tuple(map(str, g))))[:3]
            own_native = {NATIVE if tier is Tier.NATIVE_LOCAL else HEADS: native_q} if keys_native else {}
            dtypes = self._dtype_fix(index, {**given_key, **own_native}, r.config)
            raise E.NotCoveredError(
                f"{table} ({keyed.ref.label}) holds no bucket with {given_key}",
                values={"nearest_covered_keys": [dict(zip(index.group_names, g)) for g in near]},
                fix=(f"{dtypes}; or " if dtypes else "") + "use the values of a covered key (nearest listed)")
        # the lane column last: a backend picks its kernel for the dtypes already settled
        lane_column = spec.lane.column if spec.lane is not None else None
        for name in sorted(missing, key=lambda n: n == lane_column):
            options = sorted({g[positions[name]] for g in matching}, key=_sort_key)
            if len(options) == 1:
                resolved[name] = options[0]
                matching = [g for g in matching if g[positions[name]] == options[0]]
            elif name in DTYPE_COLUMNS and DEFAULT_DTYPE in options:
                resolved[name] = DEFAULT_DTYPE
                r.defaults[name] = f"{DEFAULT_DTYPE} (the default where the table measured it; give {name} to choose)"
                matching = [g for g in matching if g[positions[name]] == DEFAULT_DTYPE]
            elif spec.lane is not None and name == spec.lane.column and r.lane_options is None:
                r.lane_options = [str(o) for o in options]
            else:
                present = options or index.values.get(name, [])
                raise E.QueryFieldError(
                    f"missing field {name!r} (the table holds {len(present)} values for the fields given: "
                    f"{', '.join(map(str, present[:8]))}{' ...' if len(present) > 8 else ''})",
                    values={"field": name, "table": table, "values": [str(v) for v in present[:8]]},
                    fix=_field_help(keyed))

    def _lane_plan(self, r: _Resolving) -> QueryPlan:
        """A table whose backend picks the kernel by shape: one plan per kernel lane, the
        lane rule choosing per point."""
        spec, keyed, fields = r.keyed.spec, r.keyed, r.fields
        assert spec.lane is not None and r.lane_options is not None
        geometry = self._lane_geometry(keyed, r.index, r.config, r.native_q)
        partition = spec.lane.partition(r.lane_options, geometry)
        if partition is None:
            raise E.QueryFieldError(
                f"missing field {spec.lane.column!r}: the table holds {len(r.lane_options)} kernels for the fields "
                f"given ({', '.join(r.lane_options)}) and the lane rule ({spec.lane.description}) does not apply",
                values={"field": spec.lane.column, "table": r.table, "values": r.lane_options},
                fix=f"give {spec.lane.column}")
        subs = {lane: self.resolve({**fields, spec.lane.column: lane}, r.vector_fields) for lane, _, _ in partition}
        first = next(iter(subs.values()))
        return QueryPlan(first.grid, first.template, first.axis_fields, first.fixed, first.local,
                         first.findings_key, lanes=partition, lane_plans=subs, lane_rule=spec.lane.description)

    def _axes(self, r: _Resolving) -> None:
        """The table's axes: given, asked as arrays, or fixed where the table holds one value
        (a context query without ``step`` asks for no cached prefix)."""
        keyed, fields, index = r.keyed, r.fields, r.index
        spec = keyed.spec
        if heads_is_axis(keyed):
            r.axis_fields.append(HEADS)
        for a in spec.axes:
            r.axis_fields.append(a)
            if a in fields or a in r.vector_fields:
                continue
            present = index.axis_values[a]
            if len(present) == 1:
                r.fixed[a] = int(present[0])
            elif a == "step" and spec.phase == "context":
                r.fixed[a] = 0  # a context query without step asks for no cached prefix
                r.defaults[a] = "0 (no cached prefix; give step for a prefix)"
            else:
                raise E.QueryFieldError(
                    f"missing field {a!r}", values={"field": a, "table": r.table}, fix=_field_help(keyed))
        r.resolved.update({k: v for k, v in r.fixed.items()})

    def _native_bucket(self, r: _Resolving) -> None:
        """The group of the table the question lands in: the exact native's, or (with
        ``allow_substitute``) the nearest native's; a bucket measured with a model of another
        module geometry is not this model's."""
        keyed, index, native_q, model, config = r.keyed, r.index, r.native_q, r.model, r.config
        tier, table = keyed.family.tier, r.table
        keys_native = tier is not Tier.LOCAL

        def group_for(native: int | None) -> tuple[Any, ...]:
            out = []
            for name in index.group_names:
                if name == NATIVE or (name == HEADS and tier is Tier.NATIVE):
                    out.append(native)
                else:
                    out.append(r.resolved[name])
            return tuple(out)

        r.requested_native = native_q if keys_native else None
        used_native = r.requested_native
        group = group_for(used_native)
        if group not in index.groups:
            if keys_native:
                natives = self._natives_with(index, group, tier)
                if not natives:
                    raise self._not_covered_key(index, group, keyed, config)
                if not r.allow_substitute:
                    dtypes = self._dtype_fix(index, dict(zip(index.group_names, group)), config)
                    raise E.NotCoveredError(
                        f"{table} ({keyed.ref.label}) has no native-{native_q} bucket for this key; it holds "
                        f"native head counts {', '.join(map(str, natives))}",
                        values={"native_heads": native_q, "natives_present": natives, "model": model},
                        fix=(f"{dtypes}; or " if dtypes else "") + "query a model with one of those natives, or pass "
                            f"allow_substitute=True (--allow-substitute) to answer from the nearest "
                            f"({nearest_native(natives, native_q)}), or collect this native")
                used_native = nearest_native(natives, native_q)
                group = group_for(used_native)
                r.substituted_from = used_native
                r.substitution = (f"native {native_q} is not measured in this table; answered from the nearest "
                                  f"native bucket, {used_native} (allow_substitute)")
            else:
                raise self._not_covered_key(index, group, keyed, config)
        buckets = index.groups[group]
        r.models = tuple(sorted({m for b in buckets for m in keyed.bucket_models[b]}))
        if keys_native and config is not None and r.substitution is None and r.models:
            mismatch = geometry_mismatch(keyed, config, r.models)
            if mismatch:
                if not r.allow_substitute:
                    raise E.NotCoveredError(
                        f"native-{used_native} bucket of {table} was measured with {', '.join(r.models)}, whose "
                        f"{keyed.family.title} geometry differs from {model}'s in {', '.join(sorted(mismatch))}",
                        values={"model": model, "bucket_models": list(r.models), "differing_fields": mismatch},
                        fix="pass allow_substitute=True (--allow-substitute) to answer from that module anyway, or "
                            f"collect {model}")
                r.substituted_from = used_native
                r.substitution = (f"{model} shares native {used_native} with {', '.join(r.models)} but its geometry "
                                  f"differs in {', '.join(sorted(mismatch))}; answered from their bucket "
                                  "(allow_substitute)")
        r.used_native, r.group = used_native, group

    def _plan_of(self, r: _Resolving) -> QueryPlan:
        """The plan: the group's grid, and the answer every lookup in it starts from (the
        fields as resolved, what was derived, defaulted or substituted, the notes)."""
        keyed, fields = r.keyed, r.fields
        keys_native = keyed.family.tier is not Tier.LOCAL
        grid = r.index.grid(r.group, r.system)
        ref = keyed.ref
        assert r.version is not None
        resolved_fields: dict[str, Any] = {"table": r.table, "system": r.system, "backend": r.backend,
                                           "version": r.version}
        if r.model is not None:
            resolved_fields["model"] = str(r.model)
        if r.native_q is not None:
            resolved_fields["native_heads"] = r.native_q
        if r.tp_v is not None:
            resolved_fields["tp_size"] = r.tp_v
        if keyed.spec.head_axis:
            resolved_fields["num_heads"] = r.local
        if fields.get("layer") is not None:
            resolved_fields["layer"] = str(fields["layer"])
        resolved_fields.update({k: v for k, v in r.resolved.items() if k not in resolved_fields})
        notes = r.notes
        if r.version_note is not None:
            notes.insert(0, r.version_note)
        if ref.misplaced is not None:  # a library table served from a framework folder: where it lies
            notes.append(ref.misplaced.note)
        template = Answer(
            math.nan, "", r.table, r.system, r.backend, r.version, r.used_native if keys_native else None,
            r.local if r.local is not None else -1, (), (str(ref.path),), r.models, resolved_fields,
            requested_native=r.requested_native, substitution=r.substitution,
            reused_from=ref.reuse.from_version if ref.reuse else None,
            reuse_reason=ref.reuse.reason if ref.reuse else None, substituted_from=r.substituted_from,
            derived=r.derived, defaults=r.defaults, notes=notes, version_chosen=r.version_note is not None)
        return QueryPlan(grid, template, tuple(r.axis_fields), r.fixed, r.local, r.group)

    def _default_version(self, system: str, backend: str, table: str, native: int | None) -> tuple[str, str]:
        """The version a question naming none reads (the version policy,
        :func:`modperf.data.versions.choose_versions`): the newest whose table covers the
        native (any where no native is asked or the table keys none), and the note saying so."""
        by_version = {str(r.version): {table} for r in self.store.catalog.slots
                      if r.system == system and r.backend == backend and r.table == table}
        if not by_version:
            raise self.store.unknown_slot(system, backend, "(any version)", table)

        def answers(_: str, version: str) -> bool:
            keyed = self.store.table(system, backend, version, table)
            return native is None or keyed.family.tier is Tier.LOCAL or native in keyed.natives

        def refuse(newest: list[str]) -> E.ModperfError:
            return E.NotCoveredError(
                f"no {system}/{backend} version of {table} holds native {native}",
                values={"native_heads": native, "versions": newest},
                fix=f"versions present: {', '.join(newest)}; query one with allow_substitute, or another backend")

        version = choose_versions(f"{system}/{backend}", by_version, [table], None, answers, [], refuse=refuse)[table]
        keyed = self.store.table(system, backend, version, table)
        why = (f"version {version}: the newest {system}/{backend} {table}"
               + (f" holding native {native}" if native is not None and keyed.family.tier is not Tier.LOCAL else "")
               + " (give version to choose)")
        return version, why

    def _lane_geometry(self, keyed: KeyedTable, index: TableIndex, config: ModelConfig | None,
                       native: int | None) -> dict[str, Any]:
        """The module geometry a lane rule reads: the model's, else that of the models that
        measured the native's bucket."""
        fields = keyed.family.geometry_for(keyed.ref.table)
        if config is not None:
            try:
                return dict(config.geometry(fields))
            except E.ModelError:
                return {}
        for model, nat in keyed.model_native.items():
            if nat == native:
                return dict(keyed.model_geometry.get(model, ()))
        return {}

    @staticmethod
    def _natives_with(index: TableIndex, group: tuple[Any, ...], tier: Tier) -> list[int]:
        pos = index.group_names.index(NATIVE if tier is Tier.NATIVE_LOCAL else HEADS)
        rest = group[:pos] + group[pos + 1:]
        return sorted({int(g[pos]) for g in index.groups if g[:pos] + g[pos + 1:] == rest})

    def _not_covered_key(self, index: TableIndex, group: tuple[Any, ...], keyed: KeyedTable,
                         config: ModelConfig | None) -> E.NotCoveredError:
        names = index.group_names

        def differs(g: tuple[Any, ...]) -> list[str]:
            return [n for n, a, b in zip(names, g, group) if a != b]

        ranked = sorted(index.groups, key=lambda g: (len(differs(g)), tuple(map(str, g))))
        nearest = [dict(zip(names, g)) for g in ranked[:3]]
        asked = dict(zip(names, group))
        dtypes = self._dtype_fix(index, asked, config)
        return E.NotCoveredError(
            f"{keyed.ref.table} ({keyed.ref.label}) holds no bucket with key {asked}",
            values={"nearest_covered_keys": nearest},
            fix=(f"{dtypes}; or " if dtypes else "")
                + f"use one of the covered keys (nearest listed); columns differing from the nearest: "
                f"{', '.join(differs(ranked[0])) if ranked else '-'}")

    def _dtype_fix(self, index: TableIndex, asked: Mapping[str, Any], config: ModelConfig | None) -> str | None:
        """Where the table measured the asked key with other dtypes only (a dtype is the
        deployment's choice): those dtypes as a fix, given as fields (options) and, for the
        dtypes weights are served in, as the served variant of the model. None otherwise."""
        names = index.group_names
        same = [(i, asked[n]) for i, n in enumerate(names) if n in asked and n not in DTYPE_KEYS]
        dtype_at = [(i, n) for i, n in enumerate(names) if n in DTYPE_KEYS and n in asked]
        changes = {tuple((n, g[i]) for i, n in dtype_at if g[i] != asked[n])
                   for g in index.groups if all(g[i] == v for i, v in same)}
        changes.discard(())
        if not changes:
            return None
        from .resolve import SERVED_COLUMNS  # on use: only a miss names a served variant

        own = config.checkpoint if config is not None else None

        def not_own(change: tuple[tuple[str, Any], ...]) -> bool:  # the checkpoint's own dtypes first
            return own is None or any(str(v) != getattr(own, SERVED_COLUMNS.get(n, ""), None) for n, v in change)

        ranked = sorted(changes, key=lambda c: (len(c), not_own(c), tuple(map(str, c))))[:3]
        spelled = " or ".join(", ".join(f"{n}={v}" for n, v in c) for c in ranked)
        first = ranked[0]
        options = " ".join(f"--{n.replace('_', '-')} {v}" for n, v in first)
        text = f"the table measured this key with {spelled} (a dtype is the deployment's choice): give it ({options})"
        parts = {SERVED_COLUMNS[n]: str(v) for n, v in first if n in SERVED_COLUMNS}
        if config is not None and parts:
            variant = self.models.served(config, **parts).model_id
            if "@" in variant:
                text += f", or ask for the served variant {variant}"
        return text


#: Every interpolation axis any family declares: the numeric part of a query, left out of the
#: plan cache key so that a sweep over shapes reuses one resolved plan.
AXIS_NAMES = frozenset(a for fam in registry().values() for spec in fam.tables for a in spec.axes)


def _values_getter(names: tuple[Any, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """The values of the fields among ``names`` that are not interpolation axes, in order, as
    a tuple (operator.itemgetter: no Python loop per field)."""
    keep = [n for n in names if n not in AXIS_NAMES]
    if len(keep) >= 2:
        return itemgetter(*keep)
    if keep:
        only = keep[0]
        return lambda fields: (fields[only],)
    return lambda fields: ()


def refusal_where(distance: float) -> str:
    """Where a refused point lies, by the distance its lookup spent."""
    return "beyond the extrapolation limit" if math.isfinite(distance) else \
        "in a region of the ragged grid no measurement reaches within the limit"


def refusal_error(plan: QueryPlan, coords: Any, where: str, nearest: Any) -> E.OutOfCoverageError:
    """The error refusing a point of ``plan`` (its axis values ``coords``, :func:`refusal_where`,
    the nearest measured cells); modperf.query.lines makes a template of it with markers for
    the three."""
    grid = plan.grid
    return E.OutOfCoverageError(
        f"{plan.template.table}: point {coords} lies {where} "
        f"({grid.limit:g} octave(s) of value+1 past the measured points)",
        values={"native": plan.template.native, "measured_range": grid.ranges(), "nearest_measured": nearest},
        fix="query inside the measured range (nearest measured points above), or collect the missing shapes")


def _slot_of(t: Answer) -> tuple[str, str, str, str]:
    return (t.system, t.backend, t.version, t.table)


def grid_keyed(engine: QueryEngine, plan: QueryPlan) -> KeyedTable:
    return engine.store.table(*_slot_of(plan.template))
