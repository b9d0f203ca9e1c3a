"""Model-level attention estimate: what attention blocks cost per prefill and per decode step,
for a model on a system and backend, at each tensor-parallel size.

The model's HF config gives its layer schedule (:mod:`modperf.layers`): which family answers
each layer and with which fixed keys. Every layer group becomes one query per phase and tp
through :meth:`modperf.Database.query`, so every number keeps the query's provenance (exact /
interpolated / extrapolated, native bucket, substitution). Rules (docs/estimate.md):

- **Prefill** = sum over layers of the context-table latency at (batch, isl, prefix).
- **Decode** = sum over layers of the generation-table latency of one decode step at kv length
  ``isl + osl // 2`` (the middle of the decode; ``step`` = cached tokens). With
  ``decode_mean=True`` also the mean over every step, kv length ``isl`` .. ``isl + osl - 1``.
- **GQA blocks** add the QKV and output projections from the corpus's ``gemm`` tables
  (shapes from the config, local heads), because module-family rows include their
  projections: the GQA and module families then compare like for like.
- **Kernel choice**: where a table measured several kernels (``kernel_source``) for the
  requested dtypes, each layer group takes the fastest one that answers without extrapolation
  (else the fastest extrapolated one), as a backend that picks its best kernel per shape would;
  ``kernel_sources`` pins one per table. The answer names the kernel used.
- **Versions**: ``version`` pins one; otherwise the newest version of the system/backend whose
  tables hold every needed table and the model's native bucket (else the newest holding the
  tables; the query then says what is missing).
- Layers no attention-module table measures (linear attention, Mamba, DeepSeek-V4's
  uncompressed sliding-window layers) are listed as not included, never silently dropped.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from . import errors as E
from . import limits
from .deployment import divisors, local_heads, local_kv_heads, validate_tps
from .families import Family, family_of
from .families import registry as family_registry
from .families.base import Tier
from .interp import EXACT, EXTRAPOLATED, INTERPOLATED, KIND_NAMES, REFUSED
from .layers import AttentionLayer, LayerSchedule, layer_schedule
from .versions import version_key

if TYPE_CHECKING:
    from .db import Database
    from .query import Answer

GEMM_TABLE = "gemm"
#: Dtype key columns an estimate fills. Unless the caller sets one, it is ``bfloat16`` where the
#: table measured bfloat16 for the model's native, else the one value measured for it (else the
#: query asks for it).
DTYPE_COLUMNS = ("attn_dtype", "kv_cache_dtype", "mla_dtype", "gemm_type", "gemm_dtype")
DEFAULT_DTYPE = "bfloat16"
_KIND_ORDER = {"exact": 0, "interpolated": 1, "extrapolated": 2}


@dataclass
class Component:
    """One query that makes up a layer's block (the attention module, or a GQA projection)."""

    name: str  # attention | qkv_proj | o_proj
    table: str
    latency_ms: float
    kind: str
    kernel_source: str | None
    native: int | None
    substitution: str | None = None
    version: str | None = None
    reused_from: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "table": self.table, "latency_ms": self.latency_ms, "kind": self.kind,
                "kernel_source": self.kernel_source, "native": self.native, "substitution": self.substitution,
                "version": self.version, "reused_from": self.reused_from, "fields": self.fields}


@dataclass
class LayerCost:
    """One layer group at one tp and phase: per-layer latency and the queries behind it."""

    label: str
    count: int
    phase: str
    per_layer_ms: float
    components: list[Component]

    @property
    def total_ms(self) -> float:
        return self.per_layer_ms * self.count

    @property
    def kind(self) -> str:
        """The least exact of its components."""
        return max((c.kind for c in self.components), key=_KIND_ORDER.__getitem__)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "count": self.count, "phase": self.phase, "per_layer_ms": self.per_layer_ms,
                "total_ms": self.total_ms, "kind": self.kind, "components": [c.to_dict() for c in self.components]}


@dataclass
class TpEstimate:
    tp: int
    local_heads: int
    prefill: list[LayerCost]
    decode: list[LayerCost]
    decode_mean_ms: float | None = None
    decode_mean_kinds: dict[str, int] | None = None

    @property
    def prefill_ms(self) -> float:
        return sum(c.total_ms for c in self.prefill)

    @property
    def decode_ms(self) -> float:
        return sum(c.total_ms for c in self.decode)

    def kinds(self, phase: str) -> dict[str, int]:
        """Layer queries by kind (a layer counts once, with its least exact component)."""
        counts = Counter({"exact": 0, "interpolated": 0, "extrapolated": 0})
        for cost in self.prefill if phase == "prefill" else self.decode:
            counts[cost.kind] += cost.count
        return dict(counts)

    @property
    def substitutions(self) -> list[str]:
        seen: list[str] = []
        for cost in (*self.prefill, *self.decode):
            for comp in cost.components:
                if comp.substitution and comp.substitution not in seen:
                    seen.append(comp.substitution)
        return seen

    def to_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp, "local_heads": self.local_heads, "prefill_ms": self.prefill_ms,
            "decode_ms": self.decode_ms, "decode_mean_ms": self.decode_mean_ms,
            "prefill_kinds": self.kinds("prefill"), "decode_kinds": self.kinds("decode"),
            "decode_mean_kinds": self.decode_mean_kinds, "substitutions": self.substitutions,
            "prefill_layers": [c.to_dict() for c in self.prefill],
            "decode_layers": [c.to_dict() for c in self.decode],
        }


@dataclass
class Estimate:
    model: str
    system: str
    backend: str
    native_heads: int
    isl: int
    osl: int
    batch: int
    prefix: int
    decode_kv: int
    dtypes: dict[str, dict[str, str]]  # table -> dtype columns fixed (the rest pinned by the table)
    versions: dict[str, str]  # table -> version used
    schedule: LayerSchedule
    tps: list[TpEstimate]
    notes: list[str]
    seconds: float = 0.0

    @property
    def uncovered(self) -> list[tuple[AttentionLayer, int]]:
        return [(layer, n) for layer, n in self.schedule.groups() if not layer.covered]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "system": self.system, "backend": self.backend, "native_heads": self.native_heads,
            "isl": self.isl, "osl": self.osl, "batch": self.batch, "prefix": self.prefix,
            "decode_rule": f"one decode step at kv length isl + osl // 2 = {self.decode_kv}",
            "dtypes": self.dtypes, "versions": self.versions,
            "layers": [{"label": layer.label, "count": n, "family": layer.family, "covered": layer.covered,
                        "note": layer.note} for layer, n in self.schedule.groups()],
            "not_included": [{"label": layer.label, "count": n, "reason": layer.note} for layer, n in self.uncovered],
            "tps": [t.to_dict() for t in self.tps], "notes": self.notes, "seconds": round(self.seconds, 4),
        }


# --- planning -------------------------------------------------------------------------------


def _family(layer: AttentionLayer) -> Family:
    assert layer.family is not None
    return family_registry()[layer.family]


def _table_family(table: str) -> Family:
    fam = family_of(table)
    assert fam is not None, table  # the tables of a layer schedule are declared in modperf/families/
    return fam


def _needed_tables(schedule: LayerSchedule) -> list[str]:
    tables: list[str] = []
    for layer, _ in schedule.groups():
        if not layer.covered:
            continue
        for t in (layer.context_table, layer.generation_table):
            if t and t not in tables:
                tables.append(t)
        if not _family(layer).projections_in_rows and GEMM_TABLE not in tables:
            tables.append(GEMM_TABLE)
    return tables


def _choose_versions(db: Database, system: str, backend: str, version: str | None, tables: Sequence[str],
                     native: int, notes: list[str]) -> dict[str, str]:
    slots = [r for r in db.catalog.slots if r.system == system and r.backend == backend]
    if not slots:
        have = sorted({(r.system, r.backend) for r in db.catalog.slots})
        raise E.UnknownTableError(
            f"no tables for system={system} backend={backend}", values={"system": system, "backend": backend},
            fix="available: " + ", ".join(f"{s}/{b}" for s, b in have))
    by_version: dict[str, set[str]] = {}
    for r in slots:
        by_version.setdefault(str(r.version), set()).add(r.table)
    if version is not None:
        missing = [t for t in tables if t not in by_version.get(version, set())]
        if missing:
            holding = {t: sorted((v for v, ts in by_version.items() if t in ts), key=version_key) for t in missing}
            raise E.NotCoveredError(
                f"{system}/{backend} {version} has no {', '.join(missing)} table(s)",
                values={"versions_holding": holding}, fix="choose a version that holds them, or omit --version")
        return {t: version for t in tables}
    newest_first = sorted(by_version, key=version_key, reverse=True)
    complete = [v for v in newest_first if all(t in by_version[v] for t in tables)]
    module_tables = [t for t in tables if t != GEMM_TABLE and _table_family(t).tier is not Tier.LOCAL]
    for v in complete:
        if all(native in db.table(system, backend, v, t).natives for t in module_tables):
            return {t: v for t in tables}
    if complete:
        notes.append(f"no {system}/{backend} version holds a native-{native} bucket in every module table; "
                     f"using the newest complete version, {complete[0]}")
        return {t: complete[0] for t in tables}
    chosen = {}
    for t in tables:
        holding_t = [v for v in newest_first if t in by_version[v]]
        if not holding_t:
            raise E.NotCoveredError(
                f"no {system}/{backend} version holds a {t} table", values={"table": t},
                fix=f"see `modperf ls --system {system} --backend {backend}`")
        chosen[t] = holding_t[0]
    notes.append("no single version holds every table; each table uses its newest version: "
                 + ", ".join(f"{t} {v}" for t, v in chosen.items()))
    return chosen


def _kernels_for(keyed, fields: Mapping[str, Any]) -> list[str]:
    """Kernel sources of the table whose buckets agree with the fixed categorical fields."""
    names = keyed.key_names
    if "kernel_source" not in names:
        return []
    ks = names.index("kernel_source")
    checks = [(names.index(n), v) for n, v in fields.items() if n in names and n in keyed.spec.categorical]
    found = {key[ks] for key in keyed.bucket_keys if all(key[i] == v for i, v in checks)}
    return sorted(found)


class _Estimator:
    def __init__(self, db: Database, *, model: str, system: str, backend: str, versions: Mapping[str, str],
                 dtypes: Mapping[str, str], kernel_sources: Mapping[str, str], allow_substitute: bool,
                 hidden: int, head_dim: int, native: int) -> None:
        self.db, self.model, self.system, self.backend = db, model, system, backend
        self.native = native
        self.versions, self.dtypes, self.kernel_sources = versions, dtypes, kernel_sources
        self.allow_substitute = allow_substitute
        self.hidden, self.head_dim = hidden, head_dim
        self.used_dtypes: dict[str, dict[str, str]] = {}

    def _slot(self, table: str) -> dict[str, Any]:
        return {"table": table, "system": self.system, "backend": self.backend, "version": self.versions[table]}

    def _fixed(self, table: str, layer_fields: Mapping[str, Any]) -> dict[str, Any]:
        keyed = self.db.table(self.system, self.backend, self.versions[table], table)
        fixed: dict[str, Any] = {}
        # dtype defaults look at the model's own native buckets where the table keys natives:
        # a file may measure another model of other natives in other dtypes
        mine = [b for b in range(keyed.n_buckets) if keyed.bucket_native[b] in (-1, self.native)] \
            or range(keyed.n_buckets)  # native absent: the query will say so (or substitute)
        for col in DTYPE_COLUMNS:
            if col not in keyed.key_names:
                continue
            if col in self.dtypes:
                fixed[col] = self.dtypes[col]
                continue
            i = keyed.key_names.index(col)
            held = {keyed.bucket_keys[b][i] for b in mine}
            if DEFAULT_DTYPE in held:
                fixed[col] = DEFAULT_DTYPE
            elif len(held) == 1:
                fixed[col] = held.pop()
        self.used_dtypes.setdefault(table, {}).update(fixed)
        for k, v in layer_fields.items():
            if k in keyed.missing_optional:
                if v:  # e.g. a sliding window asked of a file that measured full attention only
                    raise E.NotCoveredError(
                        f"{keyed.ref.label} has no {k} column; it cannot answer {k}={v}",
                        values={k: v}, fix="choose a version whose table records it")
                continue
            fixed[k] = v
        return fixed

    def query(self, table: str, fields: dict[str, Any], name: str, *, vector: bool = False):
        """One component query with the kernel policy; returns (Answer, Component)."""
        keyed = self.db.table(self.system, self.backend, self.versions[table], table)
        pinned = self.kernel_sources.get(table)
        kernels = [pinned] if pinned else _kernels_for(keyed, fields)
        if len(kernels) <= 1:
            answer = self.db.query(**self._slot(table), **fields,
                                   **({"kernel_source": kernels[0]} if kernels else {}),
                                   allow_substitute=self.allow_substitute)
            return answer, self._component(name, table, answer)
        answers: list[Answer] = []
        errors: list[E.ModperfError] = []
        for ks in kernels:
            try:
                answers.append(self.db.query(**self._slot(table), **fields, kernel_source=ks,
                                             allow_substitute=self.allow_substitute))
            except (E.NotCoveredError, E.OutOfCoverageError, E.QueryFieldError) as exc:
                errors.append(exc)
        if not answers:  # the most specific reason: a point outside the grid, then a missing key
            order = (E.OutOfCoverageError, E.NotCoveredError, E.QueryFieldError)
            raise min(errors, key=lambda e: next(i for i, cls in enumerate(order) if isinstance(e, cls)))
        best = min(answers, key=lambda a: (a.kind == "extrapolated", a.latency_ms))
        return best, self._component(name, table, best)

    @staticmethod
    def _component(name: str, table: str, answer: Answer) -> Component:
        return Component(name, table, answer.latency_ms, answer.kind, answer.fields.get("kernel_source"),
                         answer.native, answer.substitution, answer.version, answer.reused_from,
                         dict(answer.fields))

    def layer(self, layer: AttentionLayer, count: int, phase: str, tp: int, batch: int, isl: int, prefix: int,
              kv: int) -> LayerCost:
        try:
            return self._layer(layer, count, phase, tp, batch, isl, prefix, kv)
        except (E.NotCoveredError, E.OutOfCoverageError, E.QueryFieldError) as exc:
            # the same error, saying which layers and which tp asked
            raise type(exc)(f"{layer.label} layers, {'prefill' if phase == 'context' else 'decode'} at tp={tp}: "
                            f"{exc.detail}", file=exc.file, values=exc.values, fix=exc.fix) from None

    def _layer(self, layer: AttentionLayer, count: int, phase: str, tp: int, batch: int, isl: int, prefix: int,
               kv: int) -> LayerCost:
        table = layer.table(phase)
        assert table is not None
        fields = self._fixed(table, layer.fields_for(phase))
        local = local_heads(layer.native_heads, tp)
        family = _family(layer)
        if phase == "context":
            shape = {"batch_size": batch, "isl": isl, "step": prefix}
            tokens = batch * isl
        else:
            shape = {"batch_size": batch, "step": kv}
            tokens = batch
        components = []
        if family.kv_heads_key is not None:
            # the layer's kv heads sharded by the backends' rule (modperf.deployment)
            key = family.kv_heads_key
            fields[key] = local_kv_heads(int(fields.get(key, 1)), tp)
            fields.setdefault("beam_width", 1)
            _, comp = self.query(table, {**fields, "num_heads": local, **shape}, "attention")
            components.append(comp)
        else:
            _, comp = self.query(table, {**fields, "model": self.model, "tp_size": tp, **shape}, "attention")
            components.append(comp)
        if not family.projections_in_rows:
            hd = int(fields.get("head_dim", self.head_dim))
            local_kv = int(fields.get(family.kv_heads_key or "", 0)) or local
            gemm = self._fixed(GEMM_TABLE, {})
            for name, n, k in (("qkv_proj", (local + 2 * local_kv) * hd, self.hidden),
                               ("o_proj", self.hidden, local * hd)):
                _, comp = self.query(GEMM_TABLE, {**gemm, "m": tokens, "n": n, "k": k}, name)
                components.append(comp)
        return LayerCost(layer.label, count, "prefill" if phase == "context" else "decode",
                         sum(c.latency_ms for c in components), components)

    def decode_mean(self, layer: AttentionLayer, cost: LayerCost, tp: int, batch: int, isl: int,
                    osl: int) -> tuple[float, Counter]:
        """Mean per-step latency of one layer over kv lengths isl .. isl + osl - 1, with the
        kernels the midpoint step chose; projections do not depend on the kv length."""
        attention = cost.components[0]
        table = attention.table
        steps = np.arange(isl, isl + osl, dtype=np.int64)
        fields = {k: v for k, v in attention.fields.items()
                  if k not in ("table", "system", "backend", "version", "step", "batch_size", "isl")}
        if _family(layer).kv_heads_key is None:
            fields = {k: v for k, v in fields.items() if k not in ("native_heads", "num_heads")}
        result = self.db.query_many(**self._slot(table), **fields, batch_size=batch, step=steps,
                                    allow_substitute=self.allow_substitute)
        lat, kinds = result.latency_ms, result.kind
        if (kinds == REFUSED).any():
            first = int(steps[np.flatnonzero(kinds == REFUSED)[0]])
            raise E.OutOfCoverageError(
                f"decode mean: {table} cannot answer kv length {first} ({cost.label}, tp={tp})",
                values={"kv_length": first, "tp": tp},
                fix="shorten isl + osl to the measured range, or drop the decode mean")
        extra = sum(c.latency_ms for c in cost.components[1:])
        counts = Counter({KIND_NAMES[k]: int((kinds == k).sum()) * cost.count
                          for k in (EXACT, INTERPOLATED, EXTRAPOLATED)})
        return float(lat.mean()) + extra, counts


def estimate(
    db: Database,
    *,
    model: str,
    system: str,
    backend: str,
    tps: Iterable[int] = (1, 2, 4, 8),
    isl: int,
    osl: int,
    batch: int,
    prefix: int = 0,
    version: str | None = None,
    dtypes: Mapping[str, str | None] | None = None,  # a None value leaves that dtype unset
    kernel_sources: Mapping[str, str] | None = None,
    decode_mean: bool = False,
    allow_substitute: bool = False,
) -> Estimate:
    """Attention cost of ``model`` per prefill and per decode step at each tp (module doc)."""
    start = time.perf_counter()
    for name, value in (("isl", isl), ("osl", osl), ("batch", batch), ("prefix", prefix)):
        rng = limits.range_of(name)
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise E.UsageError(f"{name} must be an integer in {rng.describe()}", values={name: value},
                               fix=f"pass --{name} N")
        limits.check_int(name, int(value), error=E.UsageError, fix=f"pass --{name} N in {rng.describe()}")
    if isl + osl > limits.TOKENS.high or prefix + isl > limits.CACHED_TOKENS.high:
        raise E.UsageError(f"a sequence (prefix + isl, isl + osl) is at most {limits.TOKENS.high:,} tokens",
                           values={"prefix": prefix, "isl": isl, "osl": osl}, fix="shorten isl, osl or prefix")
    tp_list = validate_tps(tps)
    config = db.models.get(model)
    schedule = layer_schedule(config)
    covered = [(layer, n) for layer, n in schedule.groups() if layer.covered]
    if not covered:
        raise E.NotCoveredError(
            f"{model} has no layer that an attention-module table measures",
            values={"layers": [layer.label for layer, _ in schedule.groups()]},
            fix="see docs/estimate.md for the layer kinds modperf covers")
    for tp in tp_list:
        bad = sorted({layer.native_heads for layer, _ in covered if layer.native_heads % tp})
        if bad:
            common = sorted(set.intersection(*(set(divisors(h)) for h in {layer.native_heads for layer, _ in covered})))
            raise E.ShardError(
                f"tp={tp} does not divide the native head count {bad[0]} of {model}",
                values={"tp": tp, "native_heads": bad[0]},
                fix=f"use tp sizes that divide it: {', '.join(map(str, common))}")
    chosen_dtypes = {k: v for k, v in (dtypes or {}).items() if v is not None}
    unknown = sorted(set(chosen_dtypes) - set(DTYPE_COLUMNS))
    if unknown:
        raise E.UsageError(f"unknown dtype option(s) {', '.join(unknown)}", values={"dtypes": unknown},
                           fix=f"dtype options are {', '.join(DTYPE_COLUMNS)}")
    notes: list[str] = []
    tables = _needed_tables(schedule)
    unused = sorted(set(kernel_sources or {}) - set(tables))
    if unused:
        raise E.OptionValueError(
            f"--kernel-source names table(s) this estimate does not use: {', '.join(map(E.quote, unused))}",
            values={"tables": unused, "used": tables}, fix=f"pin one of the tables it uses: {', '.join(tables)}")
    versions = _choose_versions(db, system, backend, version, tables, config.native_heads, notes)
    hidden = config.get("hidden_size")  # an integer in its range where present (checked when the config was read)
    if not isinstance(hidden, int):
        raise E.ModelConfigError(f"config of {model} has no hidden_size", file=config.path,
                                 fix="add hidden_size to the config")
    head_dim = int(config.get("head_dim", None) or hidden // config.native_heads)
    est = _Estimator(db, model=model, system=system, backend=backend, versions=versions, dtypes=chosen_dtypes,
                     kernel_sources=dict(kernel_sources or {}), allow_substitute=allow_substitute,
                     hidden=hidden, head_dim=head_dim, native=config.native_heads)
    decode_kv = isl + osl // 2
    results = []
    for tp in tp_list:
        prefill = [est.layer(layer, n, "context", tp, batch, isl, prefix, decode_kv) for layer, n in covered]
        decode = [est.layer(layer, n, "generation", tp, batch, isl, prefix, decode_kv) for layer, n in covered]
        tp_est = TpEstimate(tp, config.native_heads // tp, prefill, decode)
        if decode_mean:
            total = 0.0
            kinds: Counter[str] = Counter()
            for (layer, n), cost in zip(covered, decode):
                mean, counts = est.decode_mean(layer, cost, tp, batch, isl, osl)
                total += mean * n
                kinds.update(counts)
            tp_est.decode_mean_ms = total
            tp_est.decode_mean_kinds = {k: kinds.get(k, 0) for k in ("exact", "interpolated", "extrapolated")}
        results.append(tp_est)
    if any(not _family(layer).projections_in_rows for layer, _ in covered):
        notes.append("GQA blocks = attention kernel + QKV and output projections from the gemm table "
                     "(module-family rows include their projections)")
    uncovered = [(layer, n) for layer, n in schedule.groups() if not layer.covered]
    for layer, n in uncovered:
        notes.append(f"not included: {n} {layer.label} layer(s) ({layer.note})")
    return Estimate(model, system, backend, config.native_heads, isl, osl, batch, prefix, decode_kv,
                    est.used_dtypes, versions, schedule, results, notes, time.perf_counter() - start)


