"""A step's plan (:class:`StepPlan`): what pricing a model's step on a deployment needs,
settled once per database and (model, system, backend, parallelism, versions, dtypes) --
the layer kinds and their groups, the version each table is read at (the version policy),
the system's NCCL release, the dtypes served.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..base import errors as E
from ..data.versions import nearest, refuse_unknown, version_key
from ..query.resolve import SERVED_COLUMNS, layer_kinds, serve, served_note
from ..specs.layers import AttentionLayer, FfnLayer, ffn_schedule, layer_schedule
from ..specs.roofline import GpuSpec, gpu_spec
from ..specs.shard import divisors
from .step_types import ALLTOALL_TABLES, COMPOSED_FALLBACK, STEP_DTYPE_COLUMNS, Parallel
from .tables import (
    COMPOSED_MLA_TABLES,
    GEMM_TABLE,
    composes,
    refuse_unpriced_dtypes,
    versions_for_native,
)

if TYPE_CHECKING:
    from ..query.db import Database
    from ..specs.models import ModelConfig

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


def int_field(cfg: ModelConfig, name: str) -> int:
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


def is_gdn(layer: AttentionLayer, cfg: ModelConfig) -> bool:
    return not layer.covered and "linear attention" in layer.label and cfg.get("linear_num_key_heads", None) is not None


@dataclass
class StepPlan:
    """What pricing a model's step on a deployment needs, settled once per (model, system,
    backend, parallelism, versions, dtypes): the config, its attention and FFN layer kinds with
    their counts and tables, the version each table is read at, the system's NCCL release, the
    dtypes served; the resolved query fields of the ops priced so far (not the query engine's
    :class:`modperf.query.engine.QueryPlan`, which is one table's)."""

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


_PLANS: weakref.WeakKeyDictionary[Database, dict[tuple[Any, ...], StepPlan]] = weakref.WeakKeyDictionary()
PLAN_LOCK = threading.Lock()


def _plan(db: Database, model: str, system: str, backend: str, parallel: Parallel, version: str | None,
          dtypes: Mapping[str, str]) -> StepPlan:
    # the weights' dtypes are the deployment's choice: the model served in them (modperf.query.resolve.serve)
    asked = db.models.get(model)
    cfg = serve(db.models, asked, dtypes)
    schedule = layer_schedule(cfg)
    attention = _groups(schedule.layers)
    ffn = _groups(ffn_schedule(cfg))
    hidden, vocab = int_field(cfg, "hidden_size"), int_field(cfg, "vocab_size")
    tp = parallel.tp
    for layer, _, _ in attention:
        if layer.covered:
            _shard("native head count", layer.native_heads, tp, "tp", model)
        elif is_gdn(layer, cfg):
            for name in ("linear_num_key_heads", "linear_num_value_heads"):
                _shard(name.replace("_", " "), int_field(cfg, name), tp, "tp", model)
    for block, _, _ in ffn:
        if block.kind == "dense":
            _shard("intermediate size", block.inter, tp, "tp", model)
        else:
            _shard("expert intermediate size", block.inter, parallel.moe_tp_size, "moe_tp", model)
            _shard("routed experts", block.experts, parallel.moe_ep, "moe_ep", model)
            if block.shared_inter:
                _shard("shared expert width", block.shared_inter, tp, "tp", model)
    by_version = db.catalog.tables_by_version(system, backend)
    order = sorted(by_version, key=version_key)
    if version is not None and version not in by_version:
        raise refuse_unknown(f"{system}/{backend}", version, order)
    notes: list[str] = [asked.resolution] if asked.resolution else []
    covered = [(layer, n) for layer, n, _ in attention if layer.covered]
    composed = {layer for layer, _ in covered if composes(layer, by_version, version, "auto")}
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
    if any(is_gdn(layer, cfg) for layer, _, _ in attention):
        tables.append("gdn")
    chosen: dict[str, str] = {}
    if version is None and attention_tables:  # the policy's step 2 (modperf.data.versions)
        try:
            chosen = versions_for_native(db, system, backend, by_version, attention_tables, None, cfg.native_heads,
                                         notes)
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
            versions[t] = nearest(order, holding, anchor)
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
    return StepPlan(db, cfg, system, backend, parallel, gpu, attention, ffn, len(schedule.layers), composed, versions,
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
             dtypes: Mapping[str, str] | None = None) -> StepPlan:
    """The cached plan of one (model, system, backend, parallel, version, dtypes)."""
    chosen = {k: str(v) for k, v in (dtypes or {}).items() if v is not None}
    unknown = sorted(set(chosen) - set(STEP_DTYPE_COLUMNS))
    if unknown:
        raise E.UsageError(f"unknown dtype option(s) {', '.join(unknown)}", values={"dtypes": unknown},
                           fix=f"dtype options are {', '.join(STEP_DTYPE_COLUMNS)}")
    key = (model, system, backend, parallel, version, tuple(sorted(chosen.items())))
    with PLAN_LOCK:
        plans = _PLANS.setdefault(db, {})
        plan = plans.get(key)
    if plan is None:
        plan = _plan(db, model, system, backend, parallel, version, chosen)
        with PLAN_LOCK:
            plans[key] = plan
    return plan


__all__ = ["PLAN_LOCK", "StepPlan", "int_field", "is_gdn", "plan_for"]
