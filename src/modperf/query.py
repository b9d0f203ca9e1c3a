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
- Inside the group the lookup is :class:`modperf.interp.Grid`: exact / interpolated /
  extrapolated, refused past the limit with OutOfCoverageError.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from . import errors as E
from .buckets import NATIVE, KeyedTable
from .deployment import geometry_mismatch, local_heads, nearest_native
from .families import registry
from .families.base import HEADS, TP, Tier
from .interp import EXTRAPOLATION_LIMIT, KIND_NAMES, REFUSED, Grid
from .roofline import AxisWork, gpu_spec

if TYPE_CHECKING:
    from .loader import TableStore
    from .models import ModelRegistry

SLOT_FIELDS = ("table", "system", "backend", "version")
HEAD_FIELDS = ("model", "native_heads", "tp_size", "num_heads")
OPTION_FIELDS = ("allow_substitute",)
#: Key columns a query never names: derived from the head fields.
DERIVED_KEYS = (NATIVE, "local_num_heads")


@dataclass
class Answer:
    """The answer to one query."""

    latency_ms: float
    kind: str  # exact | interpolated | extrapolated
    table: str
    system: str
    backend: str
    version: str
    native: int | None  # the native bucket that answered (None: local-only table)
    local: int  # rank-local heads asked for
    locals_used: tuple[int, ...]  # measured local counts that carried weight
    files: tuple[str, ...]
    models: tuple[str, ...]  # models (aliases included) that measured the group
    fields: dict[str, Any]  # the resolved key, defaults included
    requested_native: int | None = None
    substitution: str | None = None  # set when allow_substitute answered from another native
    reused_from: str | None = None  # donor version when reuse.yaml answered
    reuse_reason: str | None = None
    extrapolation: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "latency_ms": self.latency_ms, "kind": self.kind, "table": self.table, "system": self.system,
            "backend": self.backend, "version": self.version, "native": self.native, "local": self.local,
            "locals_used": list(self.locals_used), "requested_native": self.requested_native,
            "substitution": self.substitution, "reused_from": self.reused_from, "reuse_reason": self.reuse_reason,
            "extrapolation": self.extrapolation, "files": list(self.files), "models": list(self.models),
            "fields": dict(self.fields),
        }


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
class _Plan:
    """Everything about a query except its numeric point: resolved once, reused."""

    grid: Grid
    template: Answer
    axis_fields: tuple[str, ...]  # query field per grid axis (heads axis -> None handled below)
    fixed: dict[str, int]  # defaulted axis values
    local: int | None  # heads coordinate when the grid has a heads axis


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
        axis_values = {a: np.unique(keyed.axes[a]).tolist() for a in keyed.spec.axes}
        return cls(keyed, tuple(names[i] for i in group_cols), groups, values, axis_values)

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
    rows = np.concatenate([np.arange(keyed.offsets[b], keyed.offsets[b + 1]) for b in buckets])
    if drop_point is not None:
        rows = rows[~np.isin(rows, drop_point)]
    points = {a: keyed.axes[a][rows] for a in spec.axes}
    if heads_axis:
        point_bucket = np.repeat(np.arange(keyed.n_buckets), np.diff(keyed.offsets))
        points[HEADS] = keyed.bucket_local[point_bucket[rows]]
    latency = keyed.latency[rows]
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
        return Grid(axes, points, latency, work.shape_seconds, limit=EXTRAPOLATION_LIMIT)
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

    return Grid(axes, points, latency, roofline, heads_axis=HEADS if heads_axis else None, limit=EXTRAPOLATION_LIMIT)


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


def _as_int(name: str, value: Any, keyed: KeyedTable, *, minimum: int = 0) -> int:
    if isinstance(value, bool):
        ok = False
    elif isinstance(value, (int, np.integer)):
        ok = True
    elif isinstance(value, float) and value.is_integer():
        value, ok = int(value), True
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value, ok = int(value.strip()), True
    else:
        ok = False
    if not ok or int(value) < minimum:
        raise E.QueryFieldError(
            f"field {name!r} must be an integer >= {minimum}", values={"field": name, "value": value},
            fix=_field_help(keyed))
    return int(value)


def _slot(fields: Mapping[str, Any]) -> tuple[str, str, str, str]:
    missing = [f for f in SLOT_FIELDS if fields.get(f) in (None, "")]
    if missing:
        raise E.QueryFieldError(
            f"missing field(s) {', '.join(missing)}: a query names its table, system, backend and version",
            values={"missing": missing}, fix="see `modperf ls` for the slots the data root holds")
    table, system, backend, version = (str(fields[f]) for f in SLOT_FIELDS)
    return table, system, backend, version


class QueryEngine:
    """Resolves queries against a table store and a model registry; caches table indexes and
    resolved plans."""

    #: Plans kept for repeated non-numeric parts (a sweep over batch/isl reuses one plan).
    PLAN_CACHE = 4096

    def __init__(self, store: TableStore, models: ModelRegistry) -> None:
        self.store = store
        self.models = models
        self._indexes: dict[Any, TableIndex] = {}
        self._plans: dict[tuple[Any, ...], _Plan] = {}
        self._lock = threading.Lock()

    def index(self, keyed: KeyedTable) -> TableIndex:
        key = (keyed.ref.path, keyed.ref.slot)
        index = self._indexes.get(key)
        if index is None or (index.keyed is not keyed and index.keyed.ref != keyed.ref):
            index = TableIndex.build(keyed)
            with self._lock:
                self._indexes[key] = index
        return index

    # -- single queries ------------------------------------------------------------------

    def query(self, fields: Mapping[str, Any]) -> Answer:
        axis_names = _AXIS_NAMES
        plan_key: tuple[Any, ...] | None
        plan_key = tuple(sorted((k, v) for k, v in fields.items() if k not in axis_names))
        try:
            plan = self._plans.get(plan_key)
        except TypeError:  # an unhashable value: resolve without the cache
            plan, plan_key = None, None
        if plan is None:
            plan = self._plan(fields)
            if plan_key is not None:
                if len(self._plans) >= self.PLAN_CACHE:
                    self._plans.clear()
                self._plans[plan_key] = plan
        else:
            extra = [k for k in fields if k in axis_names and k not in plan.axis_fields]
            if extra:
                self._plan(fields)  # raises the unknown-field error with the table's keys
        grid = plan.grid
        point: list[int] = []
        keyed_help = None
        for name in plan.axis_fields:
            if name == HEADS:
                assert plan.local is not None  # a single query's plan with a heads axis resolved it (_plan)
                point.append(plan.local)
                continue
            value = fields.get(name)
            if value is None:
                value = plan.fixed.get(name)
                if value is None:
                    keyed_help = keyed_help or self.store.table(*_slot_of(plan.template))
                    raise E.QueryFieldError(
                        f"missing field {name!r}", values={"field": name, "table": plan.template.table},
                        fix=_field_help(keyed_help))
            elif type(value) is not int or value < 0:
                value = _as_int(name, value, self.store.table(*_slot_of(plan.template)))
            point.append(value)
        found = grid.lookup(point)
        t = plan.template
        resolved = dict(t.fields)
        for name, x in zip(plan.axis_fields, point):
            if name != HEADS:
                resolved[name] = x
        if found.kind == REFUSED:
            raise self._refusal(plan, point, found)
        extrapolation = None
        if found.distance > 0:
            extrapolation = {
                "distance_octaves": round(found.distance, 6), "limit_octaves": grid.limit,
                "outside_axes": list(found.outside), "measured_range": grid.ranges(),
                "model": "utilisation held against the roofline of " + gpu_spec(t.system).name
                         + ("" if gpu_spec(t.system).from_file else " (default GPU: no spec file)"),
            }
        return Answer(
            found.latency_ms, KIND_NAMES[found.kind], t.table, t.system, t.backend, t.version, t.native, t.local,
            found.heads_used if found.heads_used else t.locals_used, t.files, t.models, resolved,
            t.requested_native, t.substitution, t.reused_from, t.reuse_reason, extrapolation)

    def _refusal(self, plan: _Plan, point: list[int], found) -> E.OutOfCoverageError:
        grid = plan.grid
        coords = dict(zip(grid.axes, point))
        nearest = grid.nearest_covered(point)
        where = "beyond the extrapolation limit" if math.isfinite(found.distance) else \
            "in a region of the ragged grid no measurement reaches within the limit"
        return E.OutOfCoverageError(
            f"{plan.template.table}: point {coords} lies {where} "
            f"({grid.limit:g} octave(s) of value+1 past the measured points)",
            values={"native": plan.template.native, "measured_range": grid.ranges(),
                    "nearest_measured": nearest[:3]},
            fix="query inside the measured range (nearest measured points above), or collect the missing shapes")

    def grid(self, fields: Mapping[str, Any]) -> Grid:
        """The grid that answers queries with these fields (the numeric axes and ``num_heads``,
        where it is a grid axis, may be left out): for diagnostics and tests."""
        vector = set(_AXIS_NAMES) | {HEADS}
        return self._plan(fields, vector_fields={k for k in vector if k not in fields}).grid

    # -- vectorised ------------------------------------------------------------------------

    def query_many(self, fields: Mapping[str, Any]) -> Latencies:
        """Arrays for the numeric axes (and ``num_heads`` where it is the heads axis) of one
        table group; every other field is a scalar."""
        arrays = {k: v for k, v in fields.items() if isinstance(v, (np.ndarray, list, tuple))}
        scalar = {k: v for k, v in fields.items() if k not in arrays}
        probe = dict(scalar)
        for k, v in arrays.items():
            flat = np.asarray(v).ravel()
            probe[k] = int(flat[0]) if flat.size else 0
        plan = self._plan(probe, vector_fields=set(arrays))
        grid = plan.grid
        cols = []
        for name in plan.axis_fields:
            if name == HEADS:
                cols.append(np.asarray(arrays[HEADS]) if HEADS in arrays else np.asarray(plan.local))
            elif name in arrays:
                col = np.asarray(arrays[name])
                if col.size and (not np.issubdtype(col.dtype, np.number) or (col < 0).any()):
                    raise E.QueryFieldError(f"field {name!r} must hold numbers >= 0",
                                            values={"field": name}, fix=_field_help(grid_keyed(self, plan)))
                cols.append(col)
            else:
                value = scalar.get(name, plan.fixed.get(name))
                cols.append(np.asarray(value))
        lat, kinds = grid.lookup_many(cols)
        return Latencies(lat, kinds, plan.template)

    # -- resolution ----------------------------------------------------------------------

    def _plan(self, fields: Mapping[str, Any], vector_fields: set[str] | None = None) -> _Plan:
        table, system, backend, version = _slot(fields)
        keyed = self.store.table(system, backend, version, table)
        index = self.index(keyed)
        spec, family = keyed.spec, keyed.family
        tier = family.tier
        allowed = set(SLOT_FIELDS) | set(HEAD_FIELDS) | set(OPTION_FIELDS) | set(key_columns(keyed))
        unknown = sorted(k for k in fields if k not in allowed)
        if unknown:
            raise E.QueryFieldError(
                f"unknown field(s) {', '.join(map(repr, unknown))} for table {table}",
                values={"unknown": unknown}, fix=_field_help(keyed))
        allow_substitute = bool(fields.get("allow_substitute", False))

        # -- head identity and shard -------------------------------------------------------
        model = fields.get("model")
        native_q = fields.get("native_heads")
        tp = fields.get("tp_size")
        heads = fields.get("num_heads")
        config = None
        if model is not None:
            config = self.models.get(str(model))
            native_from_model = config.native_heads
            if native_q is not None and _as_int("native_heads", native_q, keyed, minimum=1) != native_from_model:
                raise E.QueryFieldError(
                    f"native_heads={native_q} contradicts model {model} (num_attention_heads={native_from_model})",
                    values={"model": model, "native_heads": native_q}, fix="give one of model and native_heads")
            native_q = native_from_model
        elif native_q is not None:
            native_q = _as_int("native_heads", native_q, keyed, minimum=1)
        tp_v = _as_int("tp_size", tp, keyed, minimum=1) if tp is not None else None
        heads_v = _as_int("num_heads", heads, keyed, minimum=1) if heads is not None and not (
            vector_fields and HEADS in vector_fields) else None
        local: int | None = heads_v
        if tp_v is not None:
            if native_q is None:
                raise E.QueryFieldError(
                    "tp_size needs the native head count: give model or native_heads (or num_heads, the local count)",
                    values={"tp_size": tp_v}, fix=_field_help(keyed))
            local_from_tp = local_heads(native_q, tp_v)
            if heads_v is not None and heads_v != local_from_tp:
                raise E.ShardError(
                    f"num_heads={heads_v} contradicts native {native_q} / tp_size {tp_v} = {local_from_tp}",
                    values={"num_heads": heads_v, "native_heads": native_q, "tp_size": tp_v},
                    fix="give either tp_size or num_heads")
            local = local_from_tp
        if tier is Tier.NATIVE and native_q is not None and tp_v is None and heads_v is not None:
            if native_q % heads_v:
                raise E.ShardError(
                    f"num_heads={heads_v} is not native {native_q} / an integer tp_size",
                    values={"num_heads": heads_v, "native_heads": native_q}, fix="give tp_size")
            tp_v = native_q // heads_v
        if tier is not Tier.LOCAL and native_q is None:
            raise E.QueryFieldError(
                f"{table} keys [native][local] ({family.title}): give model or native_heads",
                values={"table": table}, fix=_field_help(keyed))
        if local is None and not (vector_fields and HEADS in vector_fields) and spec.head_axis:
            raise E.QueryFieldError(
                "missing the shard: give tp_size (local = native / tp) or num_heads (rank-local)",
                values={"table": table}, fix=_field_help(keyed))
        if tier is Tier.NATIVE and tp_v is None:
            raise E.QueryFieldError(
                f"{table} is native-keyed by contract and keys tp_size: give tp_size",
                values={"table": table}, fix=_field_help(keyed))

        # -- the other key columns ---------------------------------------------------------
        resolved: dict[str, Any] = {}
        categorical = set(spec.categorical)
        missing: list[str] = []
        for name in index.group_names:
            if name == NATIVE or (name == HEADS and tier is Tier.NATIVE):
                continue
            if name == TP:
                resolved[name] = tp_v
            elif name == "local_num_heads":
                resolved[name] = local
            elif name in fields:
                resolved[name] = str(fields[name]) if name in categorical else _as_int(name, fields[name], keyed)
            else:
                missing.append(name)
        if missing:
            # A key column may be left out when the fields given leave the table one value for
            # it (a table measuring one dtype; one kernel per dtype): that is the only answer
            # the table can give, and the answer echoes it.
            positions = {n: i for i, n in enumerate(index.group_names)}
            matching = [g for g in index.groups
                        if all(g[positions[n]] == v for n, v in resolved.items() if n in positions)]
            if not matching:
                given = {n: v for n, v in resolved.items() if n in positions}
                near = sorted(index.groups, key=lambda g: (sum(g[positions[n]] != v for n, v in given.items()),
                                                           tuple(map(str, g))))[:3]
                raise E.NotCoveredError(
                    f"{table} ({keyed.ref.label}) holds no bucket with {given}",
                    values={"nearest_covered_keys": [dict(zip(index.group_names, g)) for g in near]},
                    fix="use the values of a covered key (nearest listed)")
            for name in missing:
                options = sorted({g[positions[name]] for g in matching}, key=_sort_key)
                if len(options) != 1:
                    present = options or index.values.get(name, [])
                    raise E.QueryFieldError(
                        f"missing field {name!r} (the table holds {len(present)} values for the fields given: "
                        f"{', '.join(map(str, present[:8]))}{' ...' if len(present) > 8 else ''})",
                        values={"field": name, "table": table}, fix=_field_help(keyed))
                resolved[name] = options[0]
        fixed: dict[str, int] = {}
        axis_fields = []
        if heads_is_axis(keyed):
            axis_fields.append(HEADS)
        for a in spec.axes:
            axis_fields.append(a)
            present = index.axis_values[a]
            if a not in fields and len(present) == 1:
                fixed[a] = int(present[0])
            elif a not in fields and not (vector_fields and a in vector_fields):
                raise E.QueryFieldError(
                    f"missing field {a!r}", values={"field": a, "table": table}, fix=_field_help(keyed))
        resolved.update({k: v for k, v in fixed.items()})

        # -- the group, native resolution ------------------------------------------------------
        def group_for(native: int | None) -> tuple[Any, ...]:
            out = []
            for name in index.group_names:
                if name == NATIVE or (name == HEADS and tier is Tier.NATIVE):
                    out.append(native)
                else:
                    out.append(resolved[name])
            return tuple(out)

        keys_native = tier is not Tier.LOCAL
        requested_native = native_q if keys_native else None
        used_native = requested_native
        substitution = None
        group = group_for(used_native)
        if group not in index.groups:
            if keys_native:
                natives = self._natives_with(index, group, tier)
                if not natives:
                    raise self._not_covered_key(index, group, keyed)
                if not allow_substitute:
                    raise E.NotCoveredError(
                        f"{table} ({keyed.ref.label}) has no native-{native_q} bucket for this key; it holds "
                        f"native head counts {', '.join(map(str, natives))}",
                        values={"native_heads": native_q, "natives_present": natives, "model": model},
                        fix=f"query a model with one of those natives, or pass allow_substitute=True "
                            f"(--allow-substitute) to answer from the nearest ({nearest_native(natives, native_q)}), "
                            "or collect this native")
                used_native = nearest_native(natives, native_q)
                group = group_for(used_native)
                substitution = (f"native {native_q} is not measured in this table; answered from the nearest "
                                f"native bucket, {used_native} (allow_substitute)")
            else:
                raise self._not_covered_key(index, group, keyed)
        buckets = index.groups[group]
        models = tuple(sorted({m for b in buckets for m in keyed.bucket_models[b]}))
        if keys_native and config is not None and substitution is None and models:
            mismatch = geometry_mismatch(keyed, config, models)
            if mismatch:
                if not allow_substitute:
                    raise E.NotCoveredError(
                        f"native-{used_native} bucket of {table} was measured with {', '.join(models)}, whose "
                        f"{family.title} geometry differs from {model}'s in {', '.join(sorted(mismatch))}",
                        values={"model": model, "bucket_models": list(models), "differing_fields": mismatch},
                        fix="pass allow_substitute=True (--allow-substitute) to answer from that module anyway, or "
                            f"collect {model}")
                substitution = (f"{model} shares native {used_native} with {', '.join(models)} but its geometry "
                                f"differs in {', '.join(sorted(mismatch))}; answered from their bucket "
                                "(allow_substitute)")
        grid = index.grid(group, system)
        ref = keyed.ref
        resolved_fields: dict[str, Any] = {"table": table, "system": system, "backend": backend, "version": version}
        if model is not None:
            resolved_fields["model"] = str(model)
        if native_q is not None:
            resolved_fields["native_heads"] = native_q
        if tp_v is not None:
            resolved_fields["tp_size"] = tp_v
        if spec.head_axis:
            resolved_fields["num_heads"] = local
        resolved_fields.update({k: v for k, v in resolved.items() if k not in resolved_fields})
        template = Answer(
            math.nan, "", table, system, backend, version, used_native if keys_native else None,
            local if local is not None else -1, (), (str(ref.path),), models, resolved_fields,
            requested_native=requested_native, substitution=substitution,
            reused_from=ref.reuse.from_version if ref.reuse else None,
            reuse_reason=ref.reuse.reason if ref.reuse else None)
        return _Plan(grid, template, tuple(axis_fields), fixed, local)

    @staticmethod
    def _natives_with(index: TableIndex, group: tuple[Any, ...], tier: Tier) -> list[int]:
        pos = index.group_names.index(NATIVE if tier is Tier.NATIVE_LOCAL else HEADS)
        rest = group[:pos] + group[pos + 1:]
        return sorted({int(g[pos]) for g in index.groups if g[:pos] + g[pos + 1:] == rest})

    @staticmethod
    def _not_covered_key(index: TableIndex, group: tuple[Any, ...], keyed: KeyedTable) -> E.NotCoveredError:
        names = index.group_names

        def differs(g: tuple[Any, ...]) -> list[str]:
            return [n for n, a, b in zip(names, g, group) if a != b]

        ranked = sorted(index.groups, key=lambda g: (len(differs(g)), tuple(map(str, g))))
        nearest = [dict(zip(names, g)) for g in ranked[:3]]
        asked = dict(zip(names, group))
        return E.NotCoveredError(
            f"{keyed.ref.table} ({keyed.ref.label}) holds no bucket with key {asked}",
            values={"nearest_covered_keys": nearest},
            fix=f"use one of the covered keys (nearest listed); columns differing from the nearest: "
                f"{', '.join(differs(ranked[0])) if ranked else '-'}")


#: Every interpolation axis any family declares: the numeric part of a query, left out of the
#: plan cache key so that a sweep over shapes reuses one resolved plan.
_AXIS_NAMES = frozenset(a for fam in registry().values() for spec in fam.tables for a in spec.axes)


def _slot_of(t: Answer) -> tuple[str, str, str, str]:
    return (t.system, t.backend, t.version, t.table)


def grid_keyed(engine: QueryEngine, plan: _Plan) -> KeyedTable:
    return engine.store.table(*_slot_of(plan.template))
