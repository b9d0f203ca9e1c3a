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

import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..base import errors as E
from ..base import limits
from ..specs.shard import validate_tps
from .pricer import GemmFloors, StepPricer, gemm_floors
from .step_plan import PLAN_LOCK, StepPlan, plan_for
from .step_types import (
    COMPONENTS,
    COMPOSED_FALLBACK,
    OP_KINDS,
    DecodePart,
    OpCost,
    Parallel,
    SeqChunk,
    StepCost,
)

if TYPE_CHECKING:
    from ..query.db import Database

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


#: Steps priced, per database and (plan key, step shape): a deployment search and the serving
#: scoreboard ask the same step many times (one prefill per parallelism and input length, one
#: decode step per batch). Each answer is what pricing it again gives, value for value (every
#: op comes from the same plan and the same grids); callers get their own lists.
_STEPS: weakref.WeakKeyDictionary[Database, dict[tuple[Any, ...], StepCost]] = weakref.WeakKeyDictionary()
#: Steps kept per database (about 2 KiB each); full, the memo starts over.
STEP_MEMO = 1 << 16


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
        raise E.UsageError("parallel must be a modperf.model.step.Parallel", values={"parallel": repr(parallel)},
                           fix="pass parallel=Parallel(tp=...)")
    _validate_parts(prefill, decode)
    key = (model, system, backend, parallel, version, tuple(sorted((dtypes or {}).items())),
           None if prefill is None else (prefill.batch, prefill.tokens, prefill.prefix),
           None if decode is None else (decode.batch, decode.kv), graphed, allow_substitute)
    with PLAN_LOCK:
        memo = _STEPS.setdefault(db, {})
        done = memo.get(key)
    if done is None:
        plan = plan_for(db, model=model, system=system, backend=backend, parallel=parallel, version=version,
                        dtypes=dtypes)
        pricer = StepPricer(plan, graphed, allow_substitute)
        pricer.step(prefill, decode)
        versions: dict[str, str] = {}
        for op in pricer.ops:
            if op.table is not None and op.version is not None:
                versions.setdefault(op.table, op.version)  # nccl / oneccl tables live under their library only
        done = StepCost(plan.model, system, backend, parallel, prefill, decode, pricer.ops, versions,
                        [*plan.notes, *pricer.notes], pricer.served_from, served=plan.config.dtypes_served())
        with PLAN_LOCK:
            if len(memo) >= STEP_MEMO:
                memo.clear()
            memo[key] = done
    return StepCost(done.model, system, backend, parallel, prefill, decode, list(done.ops), dict(done.versions),
                    list(done.notes), list(done.served_from), dict(done.served))


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


#: (the step's vocabulary, plan and pricer are re-exported here: modperf.model.step is where a
#: caller finds a step, whichever module defines its parts)
__all__ = ["COMPONENTS", "COMPOSED_FALLBACK", "OP_KINDS", "DecodePart", "GemmFloors", "ModelEstimate",
           "ModelTpEstimate", "OpCost", "Parallel", "SeqChunk", "StepCost", "StepPlan", "StepPricer", "gemm_floors",
           "model_estimate", "plan_for", "step_cost"]
