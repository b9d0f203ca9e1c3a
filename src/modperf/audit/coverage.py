"""Coverage accounting: which (native, tp) deployments each table can answer.

A deployment is a model's native head count N sharded tp ways; one rank runs local = N / tp
heads (only where tp divides N). Per (system, backend, version, table) slot, for every native
the table holds, a **cell** (N, tp) is:

* ``measured`` -- the table holds rows of native N at local N / tp.
  In the [native][local] families that is the (N, N/tp) bucket. A tp=1 *local sweep* row
  (a model run with num_heads = L on one GPU) lands in bucket (N, L), which is the module
  one rank runs at tp = N / L, so it measures that cell: ``collected_tp`` says whether a
  cell came from sweep rows (tp_size 1), chain rows (tp_size = tp) or both. Sweep locals
  that no tp deploys (L > N, or L not dividing N) are listed as ``undeployable_locals``.
  In the native-keyed sparse-kernel tables num_heads is N on every row and tp_size is a key,
  so the cell is the bucket with that tp_size. In local-only tables (GQA, MLA kernel) the
  native is what the rows record: num_heads * tp_size (tp chains) or the model's config.
* ``answerable`` -- a query for (N, tp) is answered without substituting another native, by
  the rule a query's grid applies to its heads axis (:func:`modperf.query.deployment.heads_answer`):
  ``answer`` says how -- ``exact`` (a bucket at local N / tp: in [native][local] families the
  native's own; in local-only families any native's, because the local key completes the
  computation there), ``interpolated`` (between measured locals of the same group) or
  ``extrapolated`` (within the query's limit past the nearest measured local). In the
  native-keyed families tp_size is a key, so only a measured cell answers.

``points`` counts the grid points of the bucket(s) behind a cell, summed over their variants
(one bucket per combination of categorical keys: dtypes, kernel, op).
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..base import errors as E
from ..data.catalog import TableRef
from ..data.codes import combine, factorize, unique_codes
from ..data.families import family_of
from ..data.families import registry as family_registry
from ..data.families.base import HEADS, TP, Family, Tier
from ..data.loader import Loaded, Scope, Selection, load_many
from ..data.versions import version_key
from ..query.deployment import heads_answer
from ..specs.models import ModelConfig
from ..specs.shard import gqa_dims, kv_shardable, local_kv_heads, parse_tps, validate_tps

#: tp sizes every native is shown at (where tp divides the native); other divisors appear
#: where the table measured their local count (Kimi-K3's 96 heads: tp 3, 6, 12, ...).
STANDARD_TP = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class Cell:
    tp: int
    local: int
    measured: bool
    answerable: bool
    points: int = 0
    variants: int = 0
    collected_tp: list[int] = field(default_factory=list)
    #: How a query answers the cell: exact | interpolated | extrapolated (None: it does not).
    answer: str | None = None

    @property
    def via(self) -> str:
        """How the cell is known: chain (rows at this tp), sweep (tp=1 rows at this local),
        local (another native's rows at this local, local-only tables), interpolated /
        extrapolated (between or past the measured locals), or - (unanswerable)."""
        if not self.answerable:
            return "-"
        if not self.measured:
            return "local" if self.answer in (None, "exact") else str(self.answer)
        kinds = []
        if self.tp in self.collected_tp:
            kinds.append("chain" if self.tp > 1 else "tp1")
        if self.tp > 1 and 1 in self.collected_tp:
            kinds.append("sweep")
        return "+".join(kinds) or "chain"

    def to_dict(self) -> dict[str, Any]:
        return {"tp": self.tp, "local": self.local, "measured": self.measured, "answerable": self.answerable,
                "answer": self.answer, "points": self.points, "variants": self.variants,
                "collected_tp": self.collected_tp, "via": self.via}


@dataclass
class NativeCoverage:
    native: int
    models: list[str]
    cells: list[Cell]
    undeployable_locals: list[int] = field(default_factory=list)

    def cell(self, tp: int) -> Cell | None:
        for c in self.cells:
            if c.tp == tp:
                return c
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"native": self.native, "models": self.models, "cells": [c.to_dict() for c in self.cells],
                "undeployable_locals": self.undeployable_locals}


@dataclass
class SlotCoverage:
    """Coverage of one (system, backend, version, table) slot."""

    ref: TableRef
    family: str | None
    tier: str | None
    natives: list[NativeCoverage] = field(default_factory=list)
    #: local head count -> grid points, over every bucket (what local-only tables answer by)
    locals: dict[int, int] = field(default_factory=dict)
    failures: list[E.ModperfError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def native(self, n: int) -> NativeCoverage | None:
        for nc in self.natives:
            if nc.native == n:
                return nc
        return None

    def to_dict(self) -> dict[str, Any]:
        return {**self.ref.to_dict(), "family": self.family, "tier": self.tier, "ok": self.ok,
                "natives": [n.to_dict() for n in self.natives],
                "locals": {str(k): v for k, v in sorted(self.locals.items())},
                "failures": [f.to_dict() for f in self.failures]}


# --- per file: what the buckets hold ------------------------------------------------------


@dataclass
class _FileFacts:
    """What coverage needs from one loaded file (the big arrays are dropped)."""

    family: Any
    failures: list[E.ModperfError]
    # (native, local) -> [points, variants]; native -1 where the table records none
    by_native_local: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    # native-keyed tier: (native, tp) -> [points, variants]
    by_native_tp: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    # (native, local) -> tp sizes the rows were collected at
    collected: dict[tuple[int, int], set[int]] = field(default_factory=dict)
    locals: dict[int, int] = field(default_factory=dict)
    models_by_native: dict[int, list[str]] = field(default_factory=dict)
    geometry_by_native: dict[int, tuple] = field(default_factory=dict)
    #: bucket key dict + points, for families keying kv heads (GQA model questions)
    buckets: list[tuple[dict[str, Any], int]] = field(default_factory=list)


def _facts(loaded: Loaded) -> _FileFacts:
    facts = _FileFacts(loaded.family, list(loaded.failures))
    kt, vt = loaded.keyed, loaded.validated
    if kt is not None and vt is None:  # a caller's mistake, not the data's: never empty facts
        raise ValueError("coverage reads the validated rows: load the table with keep_validated=True")
    if kt is None or vt is None:
        return facts
    points = np.diff(kt.offsets)
    tier = kt.family.tier
    tp_index = kt.key_names.index(TP) if TP in kt.key_names else None
    for b in range(kt.n_buckets):
        nat, loc, pts = int(kt.bucket_native[b]), int(kt.bucket_local[b]), int(points[b])
        facts.locals[loc] = facts.locals.get(loc, 0) + pts
        if tier is Tier.NATIVE and tp_index is not None:
            entry = facts.by_native_tp.setdefault((nat, int(kt.bucket_keys[b][tp_index])), [0, 0])
        else:
            entry = facts.by_native_local.setdefault((nat, loc), [0, 0])
        entry[0] += pts
        entry[1] += 1
        if kt.family.kv_heads_key is not None:
            facts.buckets.append((dict(zip(kt.key_names, kt.bucket_keys[b])), pts))
    if vt.native is not None and TP in vt.integers:
        native, heads, tp = vt.native, vt.integers[HEADS], vt.integers[TP]
        codes, cards, decoders = [], [], []
        for col in (native, heads, tp):
            uniq, inv = factorize(col)
            codes.append(inv)
            cards.append(int(uniq.size))
            decoders.append(uniq)
        combined = unique_codes(combine(codes, cards, vt.n_rows))
        t_code = combined % cards[2]
        h_code = (combined // cards[2]) % cards[1]
        n_code = combined // (cards[2] * cards[1])
        for n_c, h_c, t_c in zip(n_code.tolist(), h_code.tolist(), t_code.tolist()):
            key = (int(decoders[0][n_c]), int(decoders[1][h_c]))
            facts.collected.setdefault(key, set()).add(int(decoders[2][t_c]))
    for model, nat in kt.model_native.items():
        facts.models_by_native.setdefault(nat, []).append(model)
        facts.geometry_by_native.setdefault(nat, _strip_native(kt.model_geometry.get(model, ())))
    for ms in facts.models_by_native.values():
        ms.sort()
    return facts


def _strip_native(geometry: Iterable[tuple[str, Any]]) -> tuple:
    return tuple((k, v) for k, v in geometry if k != "num_attention_heads")


def _tp_columns(native: int, measured_locals: Iterable[int]) -> list[int]:
    tps = {t for t in STANDARD_TP if t <= native and native % t == 0}
    tps |= {native // loc for loc in measured_locals if 0 < loc <= native and native % loc == 0}
    return sorted(tps)


def _slot_coverage(ref: TableRef, facts: _FileFacts) -> SlotCoverage:
    fam = facts.family
    out = SlotCoverage(ref, fam.name if fam else None, fam.tier.value if fam else None,
                       failures=list(facts.failures))
    if fam is None or facts.failures:
        return out
    out.locals = dict(sorted(facts.locals.items()))
    if fam.tier is Tier.NATIVE:
        natives = sorted({n for n, _ in facts.by_native_tp if n > 0})
        for nat in natives:
            tps = {t for (n, t) in facts.by_native_tp if n == nat}
            cols = sorted(set(_tp_columns(nat, ())) | tps)
            cells = []
            for t in cols:
                hit = facts.by_native_tp.get((nat, t))
                local = nat // t if nat % t == 0 else 0
                pts, variants = hit or (0, 0)
                cells.append(Cell(t, local, hit is not None, hit is not None, pts, variants,
                                  collected_tp=[t] if hit else [], answer="exact" if hit else None))
            out.natives.append(NativeCoverage(nat, facts.models_by_native.get(nat, []), cells))
        return out
    if fam.tier is Tier.NATIVE_LOCAL:
        natives = sorted({n for n, _ in facts.by_native_local if n > 0})
        for nat in natives:
            locals_ = sorted(loc for (n, loc) in facts.by_native_local if n == nat)
            cells = []
            for t in _tp_columns(nat, locals_):
                hit = facts.by_native_local.get((nat, nat // t))
                answer = heads_answer(locals_, nat // t)
                pts, variants = hit or (0, 0)
                cells.append(Cell(t, nat // t, hit is not None, answer is not None, pts, variants,
                                  collected_tp=sorted(facts.collected.get((nat, nat // t), ())), answer=answer))
            undeployable = [loc for loc in locals_ if loc > nat or nat % loc]
            out.natives.append(NativeCoverage(nat, facts.models_by_native.get(nat, []), cells, undeployable))
        return out
    # local-only: the natives the rows record; any native's rows at a local answer it
    natives = sorted({n for (n, _) in facts.collected if n > 0})
    for nat in natives:
        measured_locals = sorted(loc for (n, loc) in facts.collected if n == nat)
        cells = []
        for t in _tp_columns(nat, measured_locals):
            loc = nat // t
            collected = sorted(facts.collected.get((nat, loc), ()))
            pts = facts.locals.get(loc, 0)
            variants = facts.by_native_local.get((-1, loc), [0, 0])[1]
            answer = heads_answer(list(facts.locals), loc)
            cells.append(Cell(t, loc, bool(collected), answer is not None, pts, variants,
                              collected_tp=collected, answer=answer))
        undeployable = [loc for loc in measured_locals if loc > nat or nat % loc]
        out.natives.append(NativeCoverage(nat, facts.models_by_native.get(nat, []), cells, undeployable))
    return out


# --- reports ------------------------------------------------------------------------------


@dataclass
class CoverageReport:
    slots: list[SlotCoverage]
    seconds: float
    problems: list[E.ModperfError] = field(default_factory=list)  # of the data root, not one table

    @property
    def ok(self) -> bool:
        return not self.problems and all(s.ok for s in self.slots)

    @property
    def failures(self) -> list[E.ModperfError]:
        return [*self.problems, *(f for s in self.slots for f in s.failures)]

    def find(self, system: str, backend: str, version: str, table: str) -> SlotCoverage | None:
        for s in self.slots:
            if (s.ref.system, s.ref.backend, s.ref.version, s.ref.table) == (system, backend, version, table):
                return s
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "seconds": round(self.seconds, 3), "problems": [p.to_dict() for p in self.problems],
                "slots": [s.to_dict() for s in self.slots]}

    def rows(self) -> list[dict[str, Any]]:
        """One flat record per cell (the CSV layout)."""
        out = []
        for s in self.slots:
            for nc in s.natives:
                for c in nc.cells:
                    out.append({"system": s.ref.system, "backend": s.ref.backend, "version": s.ref.version,
                                "table": s.ref.table, "family": s.family, "tier": s.tier,
                                "reused_from": s.ref.reuse.from_version if s.ref.reuse else None,
                                "native": nc.native, "models": ";".join(nc.models), "tp": c.tp, "local": c.local,
                                "measured": c.measured, "answerable": c.answerable, "points": c.points,
                                "variants": c.variants, "collected_tp": ";".join(map(str, c.collected_tp)),
                                "via": c.via, "answer": c.answer})
        return out


def to_csv(records: Sequence[dict[str, Any]]) -> str:
    if not records:
        return ""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(records[0]), lineterminator="\n")
    writer.writeheader()
    for r in records:
        writer.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue()


ProgressCallback = Callable[[int, int, Any], None]


def _load_facts(selection: Selection, workers: int | None,
                on_progress: ProgressCallback | None) -> dict[Any, _FileFacts]:
    """Facts per physical file, each file loaded once however many slots it answers."""
    return load_many(selection, _facts, keep_validated=True, workers=workers, on_progress=on_progress)


def _sort_key(ref: TableRef) -> tuple:
    return (ref.system or "", ref.backend or "", version_key(ref.version), ref.table)


def coverage(
    paths: Sequence[str] | None = None,
    *,
    data_root: str | None = None,
    system: str | None = None,
    backend: str | None = None,
    version: str | None = None,
    table: str | None = None,
    model_configs: Sequence[str] | None = None,
    workers: int | None = None,
    on_progress: ProgressCallback | None = None,
) -> CoverageReport:
    """The native x tp matrix of every slot with the model's head axis (reuse-resolved) under the data root,
    or of the given files/folders."""
    start = time.perf_counter()
    scope = Scope.of(paths, data_root=data_root, table=table, system=system, backend=backend, version=version,
                     model_configs=model_configs, physical=False, head_axis_only=True)
    selection = scope.select()
    facts = _load_facts(selection, workers, on_progress)
    slots = [_slot_coverage(ref, facts[ref.path]) for ref in sorted(selection.refs, key=_sort_key)]
    return CoverageReport(slots, time.perf_counter() - start, selection.problems)


# --- diff ---------------------------------------------------------------------------------


@dataclass
class SlotDiff:
    system: str | None
    backend: str | None
    table: str
    status: str  # "both" | "only_before" | "only_after"
    #: native -> {"gained": [tp...], "lost": [tp...], "points_before": {tp: n}, "points_after": {tp: n}}
    natives: dict[int, dict[str, Any]] = field(default_factory=dict)
    locals_gained: list[int] = field(default_factory=list)
    locals_lost: list[int] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.status != "both" or bool(self.locals_gained or self.locals_lost) or any(
            d["gained"] or d["lost"] or d["points_before"] != d["points_after"] for d in self.natives.values())

    def to_dict(self) -> dict[str, Any]:
        return {"system": self.system, "backend": self.backend, "table": self.table, "status": self.status,
                "changed": self.changed,
                "natives": {str(n): {**d, "points_before": {str(k): v for k, v in d["points_before"].items()},
                                     "points_after": {str(k): v for k, v in d["points_after"].items()}}
                            for n, d in sorted(self.natives.items())},
                "locals_gained": self.locals_gained, "locals_lost": self.locals_lost}


@dataclass
class CoverageDiff:
    before: str
    after: str
    slots: list[SlotDiff]
    failures: list[E.ModperfError]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.failures

    def rows(self) -> list[dict[str, Any]]:
        """One flat record per (slot, native) (the CSV layout)."""
        return [{"system": s.system, "backend": s.backend, "table": s.table, "status": s.status, "native": nat,
                 "gained_tp": ";".join(map(str, d["gained"])), "lost_tp": ";".join(map(str, d["lost"])),
                 "points_before": sum(d["points_before"].values()), "points_after": sum(d["points_after"].values())}
                for s in self.slots for nat, d in s.natives.items()]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "before": self.before, "after": self.after, "seconds": round(self.seconds, 3),
                "slots": [s.to_dict() for s in self.slots], "failures": [f.to_dict() for f in self.failures]}


def _measured(slot: SlotCoverage) -> dict[int, dict[int, int]]:
    return {nc.native: {c.tp: c.points for c in nc.cells if c.measured} for nc in slot.natives}


def diff_slots(before: SlotCoverage | None, after: SlotCoverage | None) -> SlotDiff:
    side = after or before
    assert side is not None  # a slot is diffed because one of the versions holds it
    ref = side.ref
    status = "both" if before and after else ("only_before" if before else "only_after")
    out = SlotDiff(ref.system, ref.backend, ref.table, status)
    b = _measured(before) if before else {}
    a = _measured(after) if after else {}
    for nat in sorted(set(b) | set(a)):
        pb, pa = b.get(nat, {}), a.get(nat, {})
        out.natives[nat] = {"gained": sorted(set(pa) - set(pb)), "lost": sorted(set(pb) - set(pa)),
                            "points_before": pb, "points_after": pa}
    lb = set(before.locals) if before else set()
    la = set(after.locals) if after else set()
    out.locals_gained, out.locals_lost = sorted(la - lb), sorted(lb - la)
    return out


def coverage_diff(
    before: str,
    after: str,
    *,
    data_root: str | None = None,
    system: str | None = None,
    backend: str | None = None,
    table: str | None = None,
    model_configs: Sequence[str] | None = None,
    workers: int | None = None,
    on_progress: ProgressCallback | None = None,
) -> CoverageDiff:
    """What moving from version ``before`` to ``after`` gains and loses, per (system, backend,
    table) that holds either version: cells measured, points per cell, locals."""
    start = time.perf_counter()
    scope = Scope.of(None, data_root=data_root, table=table, system=system, backend=backend,
                     model_configs=model_configs, physical=False, head_axis_only=True)
    selection = scope.select()
    have = {r.version for r in selection.refs if r.version is not None}  # catalog refs always carry one
    for v in (before, after):
        if v not in have:
            known = sorted(have, key=version_key)
            raise E.OptionValueError(
                f"no table with the model's head axis of version {v!r} matches the filters", values={"version": v},
                fix="versions present: " + ", ".join(known[:30]) + (" ..." if len(known) > 30 else ""))
    selection.refs = refs = [r for r in selection.refs if r.version in (before, after)]
    facts = _load_facts(selection, workers, on_progress)
    cov = {(r.system, r.backend, r.table, r.version): _slot_coverage(r, facts[r.path]) for r in refs}
    pairs = sorted({(s, b, t) for (s, b, t, _) in cov}, key=lambda k: (k[0] or "", k[1] or "", k[2]))
    slots = []
    failures: list[E.ModperfError] = list(selection.problems)
    for s, b, t in pairs:
        x, y = cov.get((s, b, t, before)), cov.get((s, b, t, after))
        failures += [f for c in (x, y) if c is not None for f in c.failures]
        slots.append(diff_slots(x, y))
    return CoverageDiff(before, after, slots, failures, time.perf_counter() - start)


# --- one model, across the corpus ---------------------------------------------------------


@dataclass
class ModelAnswer:
    """Can one slot answer the model at each requested tp without substitution?"""

    ref: TableRef
    family: str
    tier: str
    match: str  # "named" | "alias" | "local-only" | "other-geometry" | "native-missing"
    models: list[str]  # names in the bucket that answers (aliases, or the chain's models)
    cells: dict[int, Cell | None]  # tp -> cell (None: tp does not divide the native)

    @property
    def answerable_tps(self) -> list[int]:
        return [t for t, c in self.cells.items() if c is not None and c.answerable]

    def to_dict(self) -> dict[str, Any]:
        return {**self.ref.to_dict(), "family": self.family, "tier": self.tier, "match": self.match,
                "models": self.models,
                "tp": {str(t): (c.to_dict() if c else None) for t, c in self.cells.items()},
                "answerable_tps": self.answerable_tps}


@dataclass
class ModelCoverage:
    model: str
    native: int
    tps: list[int]
    answers: list[ModelAnswer]
    failures: list[E.ModperfError]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> dict[str, Any]:
        """Per tp: how many slots answer; per family and table: which (system, backend, version)."""
        per_tp = {t: sum(t in a.answerable_tps for a in self.answers) for t in self.tps}
        complete = sorted({f"{a.ref.system}/{a.ref.backend}/{a.ref.version}/{a.ref.table}" for a in self.answers
                           if set(self.tps) <= set(a.answerable_tps)})
        return {"slots_considered": len(self.answers), "slots_answering_tp": {str(k): v for k, v in per_tp.items()},
                "slots_answering_every_tp": complete}

    def rows(self) -> list[dict[str, Any]]:
        """One flat record per (slot, tp) (the CSV layout)."""
        return [{"model": self.model, "native": self.native, "system": a.ref.system, "backend": a.ref.backend,
                 "version": a.ref.version, "table": a.ref.table, "family": a.family, "match": a.match, "tp": t,
                 "local": c.local if c else None, "answerable": bool(c and c.answerable),
                 "measured": bool(c and c.measured), "points": c.points if c else 0, "via": c.via if c else "n/a",
                 "answer": c.answer if c else None}
                for a in self.answers for t, c in a.cells.items()]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "model": self.model, "native": self.native, "tps": self.tps,
                "seconds": round(self.seconds, 3), "summary": self.summary(),
                "answers": [a.to_dict() for a in self.answers], "failures": [f.to_dict() for f in self.failures]}


def _model_geometry(cfg: ModelConfig, family: Any, table: str) -> tuple | None:
    try:
        return _strip_native(cfg.geometry(family.geometry_for(table)))
    except E.ModelError:
        return None  # the config lacks a field this family reads: not this kind of model


def _kernel_dims_match(cfg: ModelConfig, family: Family) -> bool:
    dims = family.notes.get("kernel_dims") or {}
    return bool(dims) and all(cfg.get(k, None) == v for k, v in dims.items())


def _kv_heads_cells(cfg: ModelConfig, family: Family, facts: _FileFacts, tps: Sequence[int]) -> dict[int, Cell | None]:
    """Cells of a table keying kv heads (GQA): the group of the model's rank-local kv heads,
    head_dim and full attention answers the local q heads by the heads-axis rule."""
    dims = gqa_dims(cfg)
    assert dims is not None and family.kv_heads_key is not None
    kv, head_dim = dims
    native = cfg.native_heads
    cells: dict[int, Cell | None] = {}
    for t in tps:
        if native % t or not kv_shardable(kv, t):
            cells[t] = None
            continue
        local, local_kv = native // t, local_kv_heads(kv, t)
        group = [(key.get(HEADS), pts) for key, pts in facts.buckets
                 if key.get(family.kv_heads_key) == local_kv and key.get("head_dim") == head_dim
                 and key.get("window_size", 0) == 0]
        hits = [pts for heads, pts in group if heads == local]
        answer = heads_answer([int(h) for h, _ in group if h is not None], local)
        cells[t] = Cell(t, local, bool(hits), answer is not None, sum(hits), len(hits), answer=answer)
    return cells


def model_coverage(
    model: str,
    tps: Sequence[int] = (1, 2, 4, 8),
    *,
    data_root: str | None = None,
    system: str | None = None,
    backend: str | None = None,
    version: str | None = None,
    table: str | None = None,
    model_configs: Sequence[str] | None = None,
    workers: int | None = None,
    on_progress: ProgressCallback | None = None,
) -> ModelCoverage:
    """Where in the corpus the model at each tp is answerable without substitution.

    A slot of a native-keyed family is considered when the model's module geometry for that
    family (its config's fields) equals a geometry measured anywhere in that family; it answers
    tp when its native-N bucket holds that geometry (the model by name or an alias) and the
    heads-axis rule answers local N / tp (:func:`modperf.query.deployment.heads_answer`). An
    MLA-kernel slot is considered when the model's latent dims equal the kernel's; a slot of a
    family keying kv heads (GQA) when the model is of no latent/sparse family; both answer tp
    by the heads-axis rule over the locals of the group the model's shard selects (GQA: local
    kv heads by the sharding rule of modperf.query.deployment, head_dim, full attention).
    """
    tps = validate_tps(tps)
    start = time.perf_counter()
    scope = Scope.of(None, data_root=data_root, table=table, system=system, backend=backend, version=version,
                     model_configs=model_configs, physical=False, head_axis_only=True)
    registry = scope.registry()
    cfg = registry.get(model)  # UnknownModelError says how to add the config
    native = cfg.native_heads
    selection = scope.select()
    refs = selection.refs
    facts = load_many(selection, _facts, registry=registry, keep_validated=True, workers=workers,
                      on_progress=on_progress)

    # geometries measured anywhere, per family (which families are this model's kind)
    measured_geometries: dict[str, set[tuple]] = {}
    for ref in refs:
        f = facts[ref.path]
        if f.family is not None:
            measured_geometries.setdefault(f.family.name, set()).update(f.geometry_by_native.values())
    # a model of a latent or sparse family is not asked about GQA kernels
    latent_or_sparse = any(
        fam.tier is not Tier.LOCAL and _model_geometry(cfg, fam, spec.name) in measured_geometries.get(fam.name, set())
        for fam in family_registry().values() for spec in fam.tables
    ) or any(_kernel_dims_match(cfg, fam) for fam in family_registry().values() if fam.tier is Tier.LOCAL)

    answers: list[ModelAnswer] = []
    failures: list[E.ModperfError] = list(selection.problems)
    for ref in sorted(refs, key=_sort_key):
        f = facts[ref.path]
        fam = family_of(ref.table)
        if fam is None:
            continue
        if f.failures:
            failures += f.failures
            continue
        slot = _slot_coverage(ref, f)
        cells: dict[int, Cell | None] = {}
        if fam.tier is not Tier.LOCAL:
            geometry = _model_geometry(cfg, fam, ref.table)
            if geometry is None or (geometry not in measured_geometries.get(fam.name, set()) and
                    model not in {m for ms in f.models_by_native.values() for m in ms}):
                continue
            nc = slot.native(native)
            if nc is None:
                match, names = "native-missing", []
            elif f.geometry_by_native.get(native) != geometry:
                match, names = "other-geometry", nc.models
            else:
                match, names = ("named" if model in nc.models else "alias"), nc.models
            for t in tps:
                if native % t:
                    cells[t] = None
                    continue
                c = nc.cell(t) if nc is not None and match in ("named", "alias") else None
                cells[t] = c if c is not None else Cell(t, native // t, False, False)
        elif fam.kv_heads_key is not None:
            if latent_or_sparse or gqa_dims(cfg) is None:
                continue
            match, names = "local-only", []
            cells = _kv_heads_cells(cfg, fam, f, tps)
        else:
            if not _kernel_dims_match(cfg, fam):
                continue
            match = "local-only"
            nc = slot.native(native)
            names = nc.models if nc else []
            for t in tps:
                if native % t:
                    cells[t] = None
                    continue
                c = nc.cell(t) if nc is not None else None
                if c is None:
                    loc = native // t
                    answer = heads_answer(list(slot.locals), loc)
                    c = Cell(t, loc, False, answer is not None, slot.locals.get(loc, 0), 0, answer=answer)
                cells[t] = c
        answers.append(ModelAnswer(ref, fam.name, fam.tier.value, match, list(names), cells))
    return ModelCoverage(model, native, list(tps), answers, failures, time.perf_counter() - start)


__all__ = ["STANDARD_TP", "Cell", "CoverageDiff", "CoverageReport", "ModelAnswer", "ModelCoverage",
           "NativeCoverage", "SlotCoverage", "SlotDiff", "coverage", "coverage_diff", "diff_slots",
           "model_coverage", "parse_tps", "to_csv"]
