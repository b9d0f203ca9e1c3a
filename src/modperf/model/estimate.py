"""Model-level attention estimate: what attention blocks cost per prefill and per decode step,
for a model on a system and backend, at each tensor-parallel size.

The model's HF config gives its layer schedule (:mod:`modperf.specs.layers`): which family answers
each layer. Every layer group becomes queries through :meth:`modperf.Database.query` by model,
tp and layer kind, so the keys the model fixes (kv heads, head_dim, window, op_name, the
checkpoint's GEMM dtype) come from the one resolution step (:mod:`modperf.query.resolve`) and every
number keeps the query's provenance. Rules (docs/estimate.md):

- **Prefill** = sum over layers of the context-table latency at (batch, isl, prefix).
- **Decode** = sum over layers of one decode step at kv length ``decode_kv`` (default
  ``isl + osl // 2``, the middle of the decode; ``step`` = cached tokens). With
  ``decode_mean=True`` also the mean over every step, kv length ``isl`` .. ``isl + osl - 1``.
- **GQA blocks** add the QKV and output projections from the corpus's ``gemm`` tables, because
  module-family rows include their projections: the families then compare like for like.
- **Composed MLA**: where a system/backend has no MLA module tables, an MLA layer is composed
  from its parts -- the projection GEMMs (``gemm``), the MLA attention kernel
  (``context_mla`` / ``generation_mla``) and, in decode, the absorbed ``mla_bmm`` pair --
  labelled ``composed``.
- **Kernel choice**: a table whose backend picks the kernel by shape (a declared lane rule)
  takes that lane; otherwise, where a table measured several kernels for the keys, each layer
  group takes the fastest one that answers without extrapolation (else the fastest
  extrapolated one); ``kernel_sources`` pins one per table.
- **Versions**: ``version`` pins one; otherwise the newest version of the system/backend whose
  tables hold every needed table and the model's native bucket (else the newest holding the
  tables; the query then says what is missing).
- **Phases answer independently**: a phase out of coverage at a tp is reported with its reason
  and the other phase still answers.
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

from ..base import errors as E
from ..base import limits
from ..data.families import registry as family_registry
from ..data.families.base import Family
from ..query.interp import EXACT, EXTRAPOLATED, INTERPOLATED, KIND_NAMES, REFUSED
from ..query.resolve import SERVED_COLUMNS, layer_kinds, serve, served_note
from ..specs.layers import AttentionLayer, LayerSchedule, layer_schedule
from ..specs.shard import divisors, local_heads, validate_tps
from .tables import (
    COMPOSED_MLA_TABLES,
    DTYPE_COLUMNS,
    GEMM_TABLE,
    composes,
    refuse_unpriced_dtypes,
    versions_for_native,
)

if TYPE_CHECKING:
    from ..query.db import Database
    from ..query.engine import Answer
    from ..specs.models import ModelConfig
    from .step import ModelEstimate

_KIND_ORDER = {"exact": 0, "interpolated": 1, "extrapolated": 2}
#: Errors that make one phase at one tp unanswerable (the other phase still answers).
_PHASE_ERRORS = (E.NotCoveredError, E.OutOfCoverageError)


@dataclass
class Component:
    """One query that makes up a layer's block (the attention module, or a GEMM / bmm part)."""

    name: str  # attention | qkv_proj | o_proj | qkv_a_proj | q_b_proj | kv_b_proj | bmm_pre | bmm_post
    table: str
    latency_ms: float
    kind: str
    kernel_source: str | None
    native: int | None
    substitution: str | None = None
    version: str | None = None
    reused_from: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    lane: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "table": self.table, "latency_ms": self.latency_ms, "kind": self.kind,
                "kernel_source": self.kernel_source, "native": self.native, "substitution": self.substitution,
                "version": self.version, "reused_from": self.reused_from, "fields": self.fields,
                "lane": self.lane}


@dataclass
class LayerCost:
    """One layer group at one tp and phase: per-layer latency and the queries behind it."""

    label: str
    count: int
    phase: str
    per_layer_ms: float
    components: list[Component]
    composed: bool = False  # built from kernel + bmm + GEMM tables (no module table here)

    @property
    def total_ms(self) -> float:
        return self.per_layer_ms * self.count

    @property
    def kind(self) -> str:
        """The least exact of its components."""
        return max((c.kind for c in self.components), key=_KIND_ORDER.__getitem__)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "count": self.count, "phase": self.phase, "per_layer_ms": self.per_layer_ms,
                "total_ms": self.total_ms, "kind": self.kind, "composed": self.composed,
                "components": [c.to_dict() for c in self.components]}


@dataclass
class TpEstimate:
    tp: int
    local_heads: int
    prefill: list[LayerCost]
    decode: list[LayerCost]
    decode_mean_ms: float | None = None
    decode_mean_kinds: dict[str, int] | None = None
    #: Why a phase could not be answered at this tp (its totals are then None).
    prefill_error: E.ModperfError | None = None
    decode_error: E.ModperfError | None = None

    @property
    def prefill_ms(self) -> float | None:
        return None if self.prefill_error else sum(c.total_ms for c in self.prefill)

    @property
    def decode_ms(self) -> float | None:
        return None if self.decode_error else sum(c.total_ms for c in self.decode)

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
            "prefill_error": self.prefill_error.to_dict() if self.prefill_error else None,
            "decode_error": self.decode_error.to_dict() if self.decode_error else None,
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
    dtypes: dict[str, dict[str, str]]  # table -> dtype columns of the answers
    versions: dict[str, str]  # table -> version used
    schedule: LayerSchedule
    tps: list[TpEstimate]
    notes: list[str]
    seconds: float = 0.0
    decode_rule: str = ""
    #: The dtypes the weights are served in beside the checkpoint's (ModelConfig.dtypes_served).
    served: dict[str, Any] = field(default_factory=dict)

    @property
    def uncovered(self) -> list[tuple[AttentionLayer, int]]:
        return [(layer, n) for layer, n in self.schedule.groups() if not layer.covered]

    @property
    def complete(self) -> bool:
        """Every phase at every tp answered."""
        return not any(t.prefill_error or t.decode_error for t in self.tps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "system": self.system, "backend": self.backend, "native_heads": self.native_heads,
            "isl": self.isl, "osl": self.osl, "batch": self.batch, "prefix": self.prefix,
            "decode_kv": self.decode_kv, "decode_rule": self.decode_rule, "complete": self.complete,
            "dtypes": self.dtypes, "served": self.served, "versions": self.versions,
            "layers": [{"label": layer.label, "name": layer.name, "count": n, "family": layer.family,
                        "covered": layer.covered, "note": layer.note} for layer, n in self.schedule.groups()],
            "not_included": [{"label": layer.label, "count": n, "reason": layer.note} for layer, n in self.uncovered],
            "tps": [t.to_dict() for t in self.tps], "notes": self.notes, "seconds": round(self.seconds, 4),
        }


# --- planning -------------------------------------------------------------------------------


def _family(layer: AttentionLayer) -> Family:
    assert layer.family is not None  # only covered layers are planned
    return family_registry()[layer.family]


def _needed_tables(groups: Sequence[tuple[AttentionLayer, int]], composed: set[AttentionLayer]) -> list[str]:
    tables: list[str] = []

    def add(t: str | None) -> None:
        if t and t not in tables:
            tables.append(t)

    for layer, _ in groups:
        if layer in composed:
            for t in COMPOSED_MLA_TABLES:
                add(t)
            continue
        add(layer.context_table)
        add(layer.generation_table)
        if not _family(layer).projections_in_rows:
            add(GEMM_TABLE)
    return tables


class _Estimator:
    def __init__(self, db: Database, *, config: ModelConfig, system: str, backend: str,
                 versions: Mapping[str, str], dtypes: Mapping[str, str], kernel_sources: Mapping[str, str],
                 allow_substitute: bool) -> None:
        self.db, self.config, self.system, self.backend = db, config, system, backend
        self.model = config.model_id
        self.versions, self.dtypes, self.kernel_sources = versions, dtypes, kernel_sources
        self.allow_substitute = allow_substitute
        self.used_dtypes: dict[str, dict[str, str]] = {}

    def _slot(self, table: str) -> dict[str, Any]:
        return {"table": table, "system": self.system, "backend": self.backend, "version": self.versions[table]}

    def _dtypes_for(self, table: str) -> dict[str, str]:
        keyed = self.db.table(self.system, self.backend, self.versions[table], table)
        return {k: v for k, v in self.dtypes.items() if k in keyed.key_names}

    def query(self, table: str, fields: Mapping[str, Any], name: str) -> tuple[Answer, Component]:
        """One component query with the kernel policy: a pinned kernel; else the one the query
        resolves (a single kernel, or the lane the backend picks by shape); else the fastest of
        the kernels the table holds for these keys that answers without extrapolation."""
        base = {**self._slot(table), **self._dtypes_for(table), **fields, "allow_substitute": self.allow_substitute}
        pinned = self.kernel_sources.get(table)
        if pinned:
            answer = self.db.answer({**base, "kernel_source": pinned}, quality=False)
            return answer, self._component(name, table, answer)
        try:
            answer = self.db.answer(base, quality=False)
            return answer, self._component(name, table, answer)
        except E.QueryFieldError as exc:
            if exc.values.get("field") != "kernel_source" or not exc.values.get("values"):
                raise
            kernels = list(exc.values["values"])
        answers: list[Answer] = []
        errors: list[E.ModperfError] = []
        for ks in kernels:
            try:
                answers.append(self.db.answer({**base, "kernel_source": ks}, quality=False))
            except (E.NotCoveredError, E.OutOfCoverageError, E.QueryFieldError) as exc:
                errors.append(exc)
        if not answers:  # the most specific reason: a point outside the grid, then a missing key
            order = (E.OutOfCoverageError, E.NotCoveredError, E.QueryFieldError)
            raise min(errors, key=lambda e: next(i for i, cls in enumerate(order) if isinstance(e, cls)))
        best = min(answers, key=lambda a: (a.kind == "extrapolated", a.latency_ms))
        return best, self._component(name, table, best)

    def _component(self, name: str, table: str, answer: Answer) -> Component:
        keyed = self.db.table(self.system, self.backend, self.versions[table], table)
        dtypes = {c: str(answer.fields[c]) for c in DTYPE_COLUMNS if c in answer.fields and c in keyed.key_names}
        self.used_dtypes.setdefault(table, {}).update(dtypes)
        return Component(name, table, answer.latency_ms, answer.kind, answer.fields.get("kernel_source"),
                         answer.native, answer.substitution, answer.version, answer.reused_from,
                         dict(answer.fields), answer.lane)

    def layer(self, layer: AttentionLayer, count: int, phase: str, tp: int, batch: int, isl: int, prefix: int,
              kv: int, composed: bool) -> LayerCost:
        try:
            if composed:
                return self._composed_mla(layer, count, phase, tp, batch, isl, prefix, kv)
            return self._module_layer(layer, count, phase, tp, batch, isl, prefix, kv)
        except (E.NotCoveredError, E.OutOfCoverageError, E.QueryFieldError) as exc:
            # the same error, saying which layers and which tp asked
            raise type(exc)(f"{layer.label} layers, {'prefill' if phase == 'context' else 'decode'} at tp={tp}: "
                            f"{exc.detail}", file=exc.file, values=exc.values, fix=exc.fix) from None

    def _layer_field(self, layer: AttentionLayer, phase: str) -> dict[str, Any]:
        """``layer`` where the model runs several kinds on the table (the query needs it)."""
        table = layer.table(phase)
        assert table is not None
        return {"layer": layer.name} if len(layer_kinds(self.config, table, phase)) > 1 else {}

    def _module_layer(self, layer: AttentionLayer, count: int, phase: str, tp: int, batch: int, isl: int,
                      prefix: int, kv: int) -> LayerCost:
        table = layer.table(phase)
        assert table is not None
        family = _family(layer)
        if phase == "context":
            shape: dict[str, Any] = {"batch_size": batch, "isl": isl, "step": prefix}
            tokens = batch * isl
        else:
            shape = {"batch_size": batch, "step": kv}
            tokens = batch
        fields = {"model": self.model, "tp_size": tp, **self._layer_field(layer, phase), **shape}
        if "beam_width" in self._keys(table):
            fields["beam_width"] = 1  # one sequence per request
        answer, comp = self.query(table, fields, "attention")
        components = [comp]
        if not family.projections_in_rows:
            hidden = int(self.config.get("hidden_size"))
            local = int(answer.fields["num_heads"])
            hd = int(answer.fields.get("head_dim") or hidden // layer.native_heads)
            local_kv = int(answer.fields.get(family.kv_heads_key or "", 0) or local)
            for name, n, k in (("qkv_proj", (local + 2 * local_kv) * hd, hidden), ("o_proj", hidden, local * hd)):
                _, c = self.query(GEMM_TABLE, {"model": self.model, "m": tokens, "n": n, "k": k}, name)
                components.append(c)
        return LayerCost(layer.label, count, "prefill" if phase == "context" else "decode",
                         sum(c.latency_ms for c in components), components)

    def _keys(self, table: str) -> set[str]:
        keyed = self.db.table(self.system, self.backend, self.versions[table], table)
        return set(keyed.key_names)

    def _composed_mla(self, layer: AttentionLayer, count: int, phase: str, tp: int, batch: int, isl: int,
                      prefix: int, kv: int) -> LayerCost:
        """An MLA layer from its parts (docs/estimate.md): the fused q/kv down-projection, the q
        up-projection, in prefill the kv up-projection (non-absorbed attention over all keys)
        and the attention kernel, in decode the absorbed bmm pair around the kernel, then the
        output projection."""
        cfg = self.config
        hidden = int(cfg.get("hidden_size"))
        q_lora = cfg.get("q_lora_rank", None)
        kv_lora, nope = int(cfg.get("kv_lora_rank")), int(cfg.get("qk_nope_head_dim"))
        rope, v = int(cfg.get("qk_rope_head_dim")), int(cfg.get("v_head_dim"))
        local = local_heads(layer.native_heads, tp)
        gemm = {"model": self.model}
        parts: list[tuple[str, str, dict[str, Any]]] = []
        tokens = batch * isl if phase == "context" else batch
        down = (int(q_lora) if q_lora else 0) + kv_lora + rope
        parts.append(("qkv_a_proj", GEMM_TABLE, {**gemm, "m": tokens, "n": down, "k": hidden}))
        if q_lora:
            parts.append(("q_b_proj", GEMM_TABLE, {**gemm, "m": tokens, "n": local * (nope + rope), "k": int(q_lora)}))
        else:  # no q low-rank: the q projection reads the hidden state directly
            parts.append(("q_proj", GEMM_TABLE, {**gemm, "m": tokens, "n": local * (nope + rope), "k": hidden}))
        heads = {"model": self.model, "tp_size": tp}
        if phase == "context":
            parts.append(("kv_b_proj", GEMM_TABLE,
                          {**gemm, "m": batch * (isl + prefix), "n": local * (nope + v), "k": kv_lora}))
            parts.append(("attention", "context_mla", {**heads, "batch_size": batch, "isl": isl, "step": prefix}))
        else:
            parts.append(("bmm_pre", "mla_bmm", {**heads, "op_name": "mla_gen_pre", "num_tokens": batch}))
            parts.append(("attention", "generation_mla", {**heads, "batch_size": batch, "step": kv}))
            parts.append(("bmm_post", "mla_bmm", {**heads, "op_name": "mla_gen_post", "num_tokens": batch}))
        parts.append(("o_proj", GEMM_TABLE, {**gemm, "m": tokens, "n": hidden, "k": local * v}))
        components = [self.query(table, fields, name)[1] for name, table, fields in parts]
        return LayerCost(layer.label, count, "prefill" if phase == "context" else "decode",
                         sum(c.latency_ms for c in components), components, composed=True)

    def decode_mean(self, layer: AttentionLayer, cost: LayerCost, tp: int, batch: int, isl: int,
                    osl: int) -> tuple[float, Counter]:
        """Mean per-step latency of one layer over kv lengths isl .. isl + osl - 1, with the
        kernels the midpoint step chose; the parts that do not depend on the kv length (the
        projections, the bmm pair) are added as they are."""
        attention = next(c for c in cost.components if c.name == "attention")
        table = attention.table
        steps = np.arange(isl, isl + osl, dtype=np.int64)
        fields = {k: v for k, v in attention.fields.items()
                  if k not in ("table", "system", "backend", "version", "step", "batch_size", "isl")}
        result = self.db.query_many(**self._slot(table), **fields, batch_size=batch, step=steps,
                                    allow_substitute=self.allow_substitute)
        lat, kinds = result.latency_ms, result.kind
        if (kinds == REFUSED).any():
            first = int(steps[np.flatnonzero(kinds == REFUSED)[0]])
            raise E.OutOfCoverageError(
                f"decode mean: {table} cannot answer kv length {first} ({cost.label}, tp={tp})",
                values={"kv_length": first, "tp": tp},
                fix="shorten isl + osl to the measured range, or drop the decode mean")
        extra = sum(c.latency_ms for c in cost.components if c is not attention)
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
    decode_kv: int | None = None,
    version: str | None = None,
    dtypes: Mapping[str, str | None] | None = None,
    kernel_sources: Mapping[str, str] | None = None,
    decode_mean: bool = False,
    allow_substitute: bool = False,
    mla: str = "auto",
    scope: str = "attention",
    moe_tp: int | None = None,
    moe_ep: int = 1,
    attention_dp: int = 1,
) -> Estimate | ModelEstimate:
    """Attention cost of ``model`` per prefill and per decode step at each tp (module doc), or
    with ``scope="model"`` the whole model's step (:func:`modperf.model.step.model_estimate`,
    a :class:`~modperf.model.step.ModelEstimate`)."""
    if scope not in ("attention", "model"):
        raise E.UsageError(f"scope must be model or attention, not {E.quote(scope)}", values={"scope": scope},
                           fix="model prices every op of a step; attention the attention blocks")
    start = time.perf_counter()
    for name, value in (("isl", isl), ("osl", osl), ("batch", batch), ("prefix", prefix),
                        ("decode_kv", decode_kv if decode_kv is not None else 1)):
        rng = limits.range_of(name)
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise E.UsageError(f"{name} must be an integer in {rng.describe()}", values={name: value},
                               fix=f"pass --{name.replace('_', '-')} N")
        limits.check_int(name, int(value), error=E.UsageError,
                         fix=f"pass --{name.replace('_', '-')} N in {rng.describe()}")
    if isl + osl > limits.TOKENS.high or prefix + isl > limits.CACHED_TOKENS.high:
        raise E.UsageError(f"a sequence (prefix + isl, isl + osl) is at most {limits.TOKENS.high:,} tokens",
                           values={"prefix": prefix, "isl": isl, "osl": osl}, fix="shorten isl, osl or prefix")
    tp_list = validate_tps(tps)
    if scope == "model":
        unsupported = [name for name, given in (("kernel_sources", kernel_sources), ("decode_mean", decode_mean),
                                                ("allow_substitute", allow_substitute), ("mla", mla != "auto"))
                       if given]
        if unsupported:
            raise E.UsageError(f"{', '.join(unsupported)} apply to scope attention only", values={"scope": scope},
                               fix="drop them, or pass --scope attention")
        from .step import model_estimate  # same layer; imported here, model_step builds on this module

        return model_estimate(db, model=model, system=system, backend=backend, tps=tp_list, isl=isl, osl=osl,
                              batch=batch, prefix=prefix, decode_kv=decode_kv, version=version, dtypes=dtypes,
                              moe_tp=moe_tp, moe_ep=moe_ep, attention_dp=attention_dp)
    if (moe_tp, moe_ep, attention_dp) != (None, 1, 1):
        raise E.UsageError("moe_tp, moe_ep and attention_dp apply to scope model only",
                           values={"moe_tp": moe_tp, "moe_ep": moe_ep, "attention_dp": attention_dp},
                           fix="pass --scope model")
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
    if mla not in ("auto", "module", "composed"):
        raise E.UsageError(f"mla must be auto, module or composed, not {mla!r}", values={"mla": mla},
                           fix="auto composes MLA layers only where no module table exists")
    chosen_dtypes = {k: str(v) for k, v in (dtypes or {}).items() if v is not None}
    if "moe_dtype" in chosen_dtypes:
        raise E.UsageError("moe_dtype applies to scope model only: the attention blocks hold no experts",
                           values={"moe_dtype": chosen_dtypes["moe_dtype"], "scope": scope},
                           fix="pass --scope model, or drop --moe-dtype")
    unknown = sorted(set(chosen_dtypes) - set(DTYPE_COLUMNS))
    if unknown:
        raise E.UsageError(f"unknown dtype option(s) {', '.join(unknown)}", values={"dtypes": unknown},
                           fix=f"dtype options are {', '.join(DTYPE_COLUMNS)}")
    notes: list[str] = [config.resolution] if config.resolution else []
    # the dense layers' dtype is the deployment's choice: the model served in it (modperf.query.resolve.serve)
    config = serve(db.models, config, chosen_dtypes)
    by_version = db.catalog.tables_by_version(system, backend)
    composed = {layer for layer, _ in covered if composes(layer, by_version, version, mla)}
    tables = _needed_tables(covered, composed)
    versions = versions_for_native(db, system, backend, by_version, tables, version, config.native_heads, notes)
    refuse_unpriced_dtypes(db, system, backend, versions, chosen_dtypes)
    served = served_note(config)
    if served is not None:
        notes.append(served)
    unknown_pins = sorted(set(kernel_sources or {}) - set(tables))
    if unknown_pins:
        raise E.OptionValueError(
            f"--kernel-source names table(s) this estimate does not use: {', '.join(map(E.quote, unknown_pins))}",
            values={"tables": unknown_pins, "used": tables}, fix=f"pin one of the tables it uses: {', '.join(tables)}")
    if not isinstance(config.get("hidden_size"), int):  # in its range where present (checked on reading)
        raise E.ModelConfigError(f"config of {model} has no hidden_size", file=config.path,
                                 fix="add hidden_size to the config")
    est = _Estimator(db, config=config, system=system, backend=backend, versions=versions,
                     dtypes={k: v for k, v in chosen_dtypes.items() if k not in SERVED_COLUMNS},
                     kernel_sources=dict(kernel_sources or {}), allow_substitute=allow_substitute)
    kv = decode_kv if decode_kv is not None else isl + osl // 2
    decode_rule = (f"one decode step at kv length {kv} (decode_kv)" if decode_kv is not None
                   else f"one decode step at kv length isl + osl // 2 = {kv}")
    results = []
    for tp in tp_list:
        tp_est = TpEstimate(tp, config.native_heads // tp, [], [])
        try:
            tp_est.prefill = [est.layer(layer, n, "context", tp, batch, isl, prefix, kv, layer in composed)
                              for layer, n in covered]
        except _PHASE_ERRORS as exc:
            tp_est.prefill, tp_est.prefill_error = [], exc
        try:
            tp_est.decode = [est.layer(layer, n, "generation", tp, batch, isl, prefix, kv, layer in composed)
                             for layer, n in covered]
        except _PHASE_ERRORS as exc:
            tp_est.decode, tp_est.decode_error = [], exc
        if decode_mean and tp_est.decode_error is None:
            total, kinds = 0.0, Counter[str]()
            for (layer, n), cost in zip(covered, tp_est.decode):
                mean, counts = est.decode_mean(layer, cost, tp, batch, isl, osl)
                total += mean * n
                kinds.update(counts)
            tp_est.decode_mean_ms = total
            tp_est.decode_mean_kinds = {k: kinds.get(k, 0) for k in ("exact", "interpolated", "extrapolated")}
        results.append(tp_est)
    failures = [e for t in results for e in (t.prefill_error, t.decode_error) if e is not None]
    if failures and len(failures) == 2 * len(results):
        raise failures[0]  # nothing answered: the first reason is the answer
    if any(not _family(layer).projections_in_rows for layer, _ in covered if layer not in composed):
        notes.append("GQA blocks = attention kernel + QKV and output projections from the gemm table "
                     "(module-family rows include their projections)")
    for layer in composed:
        notes.append(f"{layer.label} layers composed from {', '.join(COMPOSED_MLA_TABLES)} ({system}/{backend} has no "
                     "MLA module tables): q/kv projections, attention kernel, absorbed bmm pair in decode, output "
                     "projection")
    uncovered = [(layer, n) for layer, n in schedule.groups() if not layer.covered]
    for layer, n in uncovered:
        notes.append(f"not included: {n} {layer.label} layer(s) ({layer.note})")
    return Estimate(model, system, backend, config.native_heads, isl, osl, batch, prefix, kv, est.used_dtypes,
                    versions, schedule, results, notes, time.perf_counter() - start, decode_rule,
                    config.dtypes_served())
