"""``modperf check``: load every declared table with every guard and report per family.

Findings are collected, never short-circuited: one bad file does not hide another, and one
file reports all of its problems. Each finding is a **failure** (data that would be read
wrongly or not at all: the report is not ok, exit 1) or a **warning** (readable and
unambiguous, but out of place or unusual: listed with its fix, exit 0); its kind decides which
(:attr:`modperf.base.errors.ModperfError.severity`), and ``strict`` fails on warnings too. With
``quality`` the same load also feeds the plausibility checks (:mod:`modperf.data.quality`): every
file is read and validated once.

A whole-corpus check (no quality) loads its files in forked worker processes where the
platform forks: loading a table is mostly many small numpy calls that hold the GIL, so threads
barely overlap; each worker sends back only the file's :class:`FileResult` (its failures
rebuilt attribute for attribute, so a report is the same whichever way it was loaded).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base import errors as E
from ..base import limits
from ..data.catalog import LIBRARY_FAMILY_DIR, TableRef
from ..data.families import family_of, registry
from ..data.loader import Loaded, Scope, Selection, load_groups, load_many, load_one
from ..specs.models import ModelRegistry

if TYPE_CHECKING:  # the plausibility checks load with --quality only
    from ..data.quality import QualityReport, Thresholds

ProgressCallback = Callable[[int, int, Any], None]


@dataclass
class FileResult:
    """What check found in one table file."""

    ref: TableRef
    family: str | None
    failures: list[E.ModperfError]
    warnings: list[E.ModperfError] = field(default_factory=list)
    rows: int = 0  # rows of the file as stored (0 when it failed)
    points: int = 0
    buckets: int = 0
    natives: list[int] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    duplicates_merged: int = 0
    alias_duplicate_points: int = 0
    agreement: dict[str, Any] | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    @classmethod
    def from_load(cls, res: Loaded) -> FileResult:
        out = cls(res.ref, res.family.name if res.family else None, list(res.failures), seconds=res.seconds)
        t = res.keyed
        if t is not None:
            out.rows, out.points, out.buckets = t.rows_stored, t.n_points, t.n_buckets
            out.natives, out.models = t.natives, t.models
            out.duplicates_merged, out.alias_duplicate_points = t.duplicates_merged, t.alias_duplicate_points
            if t.agreement is not None:
                out.agreement = t.agreement.to_dict()
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.ref.to_dict(),
            "family": self.family,
            "ok": self.ok,
            "rows": self.rows,
            "points": self.points,
            "buckets": self.buckets,
            "natives": self.natives,
            "models": self.models,
            "duplicates_merged": self.duplicates_merged,
            "alias_duplicate_points": self.alias_duplicate_points,
            "agreement": self.agreement,
            "failures": [f.to_dict() for f in self.failures],
            "warnings": [w.to_dict() for w in self.warnings],
        }


@dataclass
class FamilySummary:
    """One family's files and rows as check saw them."""

    family: str
    title: str
    tier: str
    native_source: str
    #: Some table of the family has a num_heads column (the tier describes its keying).
    head_axis: bool = True
    files: int = 0
    files_failed: int = 0
    rows: int = 0
    points: int = 0
    buckets: int = 0
    natives: set[int] = field(default_factory=set)
    models: set[str] = field(default_factory=set)
    duplicates_merged: int = 0
    alias_duplicate_points: int = 0
    failures: int = 0
    warnings: int = 0
    #: Per file where different natives measured the same local key (local-only tier).
    agreement: list[dict[str, Any]] = field(default_factory=list)

    def add(self, fr: FileResult) -> None:
        self.files += 1
        self.files_failed += int(not fr.ok)
        self.failures += len(fr.failures)
        self.warnings += len(fr.warnings)
        self.rows += fr.rows
        self.points += fr.points
        self.buckets += fr.buckets
        self.natives.update(fr.natives)
        self.models.update(fr.models)
        self.duplicates_merged += fr.duplicates_merged
        self.alias_duplicate_points += fr.alias_duplicate_points
        if fr.agreement and fr.agreement.get("shared_keys"):
            self.agreement.append({"table": fr.ref.label, **fr.agreement})

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family, "title": self.title, "tier": self.tier, "native_source": self.native_source,
            "head_axis": self.head_axis, "files": self.files, "files_failed": self.files_failed, "rows": self.rows,
            "points": self.points,
            "buckets": self.buckets, "natives": sorted(self.natives), "models": sorted(self.models),
            "duplicates_merged": self.duplicates_merged, "alias_duplicate_points": self.alias_duplicate_points,
            "failures": self.failures, "warnings": self.warnings, "agreement": self.agreement,
        }


@dataclass
class CheckReport:
    """Every file's result, the failures not tied to one file, and the families checked.
    ``strict``: warnings count as failures (``check --strict``)."""

    files: list[FileResult]
    families: dict[str, FamilySummary]
    problems: list[E.ModperfError]  # failures not tied to one table (catalog, reuse)
    skipped: int  # table files found that no family declares
    seconds: float
    quality: QualityReport | None = None
    strict: bool = False

    @property
    def failures(self) -> list[E.ModperfError]:
        """Every failure, and under ``strict`` every warning too."""
        found = [*self.problems, *(f for fr in self.files for f in fr.failures)]
        return [*found, *self._warnings()] if self.strict else found

    @property
    def warnings(self) -> list[E.ModperfError]:
        """Every warning (none under ``strict``: they are failures there)."""
        return [] if self.strict else self._warnings()

    def _warnings(self) -> list[E.ModperfError]:
        return [w for fr in self.files for w in fr.warnings]

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def rows(self) -> int:
        return sum(fr.rows for fr in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "strict": self.strict,
            "files_checked": len(self.files),
            "files_failed": sum(bool(fr.failures or (self.strict and fr.warnings)) for fr in self.files),
            "rows": self.rows,
            "failures": len(self.failures),
            "warnings": len(self.warnings),
            "skipped_undeclared": self.skipped,
            "seconds": round(self.seconds, 3),
            "families": {k: v.to_dict() for k, v in self.families.items()},
            "problems": [p.to_dict() for p in self.problems],
            "files": [fr.to_dict() for fr in self.files],
            **({"quality": self.quality.to_dict()} if self.quality is not None else {}),
        }


def check(
    paths: Sequence[str] | None = None,
    *,
    data_root: str | None = None,
    table: str | None = None,
    model_configs: Iterable[str] | None = None,
    on_progress: ProgressCallback | None = None,
    workers: int | None = None,
    quality: Thresholds | None = None,
    quality_examples: int = 10,
    scope: Scope | None = None,
    strict: bool = False,
) -> CheckReport:
    """Load every declared table under ``data_root`` (or the given files/folders) with
    every guard; with ``quality``, assess the loaded tables too; with ``strict``, warnings
    count as failures. Raises only for usage errors (bad root, unknown table); data problems
    are in the report."""
    start = time.perf_counter()
    if quality is not None:
        quality.validate()
        limits.check_int("quality_examples", quality_examples, rng=limits.EXAMPLES, error=E.OptionValueError,
                         fix="pass --quality-examples N (0 lists every finding)")
    scope = scope or Scope.of(paths, data_root=data_root, table=table, model_configs=model_configs)
    selection = scope.select()
    families = {
        name: FamilySummary(name, fam.title, fam.tier.value, fam.native_source.value, fam.has_head_axis)
        for name, fam in registry().items()
    }
    quality_report = None
    if quality is None:
        by_path = _load_results(selection, workers, on_progress)
        results = [by_path[ref.path] for ref in selection.refs]
    else:
        from ..data.quality import QualityReport, assess_loaded, group_key, sort_files

        q_start = time.perf_counter()

        def each(group: list[Loaded]) -> list[tuple[FileResult, Any]]:
            return list(zip([FileResult.from_load(ld) for ld in group],
                            assess_loaded(group, quality, quality_examples)))

        pairs = load_groups(selection, group_key, each, workers=workers, on_progress=on_progress)
        results = [fr for fr, _ in pairs]
        quality_report = QualityReport(quality, sort_files([fq for _, fq in pairs]), time.perf_counter() - q_start)
    registry_ = None
    for fr in results:
        if fr.ref.misplaced is not None and fr.ok:
            registry_ = registry_ or selection.scope.registry()
            placement_finding(fr, registry_)
    for fr in results:
        if fr.family is not None:
            families[fr.family].add(fr)
    used = {fr.family for fr in results}
    families = {k: v for k, v in families.items() if k in used or not scope.paths}
    return CheckReport(results, families, selection.problems, selection.skipped, time.perf_counter() - start,
                       quality_report, strict)


def placement_finding(result: FileResult, registry: ModelRegistry) -> None:
    """What a library table filed in a framework folder, which loaded (its rows record one
    release), is: served as that release (a warning); not served because the release's own
    file answers and holds every key it holds (a warning: a re-measurement, nothing merged);
    not served while some of its data is read nowhere (a failure: its release's file lacks
    some of its keys, or other misplaced files claim the same release)."""
    ref = result.ref
    placed = ref.misplaced
    assert placed is not None and placed.release is not None
    belongs = Path(placed.file).parents[3] / LIBRARY_FAMILY_DIR / placed.library / placed.release
    head = (f"{placed.library} table filed in the {ref.backend} framework folder {placed.folder}/: its rows record "
            f"release {placed.release}")
    values: dict[str, Any] = {"folder": f"{ref.backend}/{ref.version}", "recorded_versions": list(placed.recorded),
                              "belongs_in": placed.target}
    if placed.served_as is not None:
        result.warnings.append(E.MisplacedTableError(
            f"{head}, so it is served as {placed.served_as} (every answer from it names this file)", file=ref.path,
            values={**values, "served_as": placed.served_as},
            fix=f"move it where it belongs: mkdir -p {belongs} && mv {ref.path} {belongs}/"))
        return
    if placed.rivals:
        result.failures.append(E.MisplacedUnservedError(
            f"{head}, as {len(placed.rivals)} other misplaced file(s) do: none of them is served (which one answers "
            "that release is not guessed)", file=ref.path, values={**values, "rivals": list(placed.rivals)},
            fix=f"move the file to keep to {belongs}/ and delete or re-file the others"))
        return
    assert placed.held_by is not None
    holder = load_one(TableRef(ref.table, Path(placed.held_by), ref.system, LIBRARY_FAMILY_DIR, placed.library,
                               placed.release), registry)
    mine = load_one(ref, registry).keyed
    if holder.keyed is None or mine is None:
        result.failures.append(E.MisplacedUnservedError(
            f"{head}, whose own file {placed.held_by} answers that release but does not load: neither is served",
            file=ref.path, values={**values, "held_by": placed.held_by},
            fix=f"run `modperf check {placed.held_by}` and fix it, or replace it with this file: "
                f"mv {ref.path} {placed.held_by}"))
        return
    held, here = holder.keyed.point_latencies(), mine.point_latencies()
    shared = [k for k in here if k in held]
    only_here = [k for k in here if k not in held]
    ratios = sorted(here[k] / held[k] for k in shared if held[k] > 0)
    median_ratio = round(ratios[(len(ratios) - 1) // 2], 4) if ratios else None
    values.update(held_by=placed.held_by, shared_keys=len(shared), keys_only_here=len(only_here),
                  median_ratio=median_ratio)
    if only_here:
        result.failures.append(E.MisplacedUnservedError(
            f"{head}, whose own file answers that release: this file is not served, and {len(only_here)} of its "
            f"{len(here)} keys are in no other file (read nowhere)", file=ref.path, values=values,
            fix=f"merge its rows into {placed.held_by} (nothing is merged silently), or re-file it under the release "
                "it measured"))
        return
    result.warnings.append(E.MisplacedTableError(
        f"{head}, whose own file answers that release: this file is not served (it re-measures {len(shared)} of "
        f"that file's keys and holds none that file lacks; median latency ratio, this file to that one: "
        f"{median_ratio})", file=ref.path, values=values,
        fix=f"keep one of the two: delete this one (rm {ref.path}), or put it in place of the other "
            f"(mv {ref.path} {placed.held_by})"))


#: A file's result as a worker sends it: the failures as (class, args, attributes).
_Packed = tuple[FileResult, list[tuple[type[E.ModperfError], tuple[Any, ...], dict[str, Any]]]]
#: Fewer files than this load in threads: forking workers costs more than it saves.
PROCESS_MIN_FILES = 16
#: What a forked worker loads (set before the fork, inherited by the workers).
_FORKED: dict[str, Any] = {}


def _load_results(selection: Selection, workers: int | None,
                  on_progress: ProgressCallback | None) -> dict[Any, FileResult]:
    """Every selected file's result, loaded in forked processes where that can pay, else in
    the loader's thread pool."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    workers = workers or min(4, os.cpu_count() or 1)
    physical = list({ref.path: ref for ref in selection.refs}.values())
    if workers < 2 or len(physical) < PROCESS_MIN_FILES or "fork" not in multiprocessing.get_all_start_methods():
        return load_many(selection, FileResult.from_load, workers=workers, on_progress=on_progress)
    from ..data import buckets, keyed_guards, reader, validate  # noqa: F401  (imported once, before the fork)

    _FORKED.update(refs=physical, registry=selection.scope.registry())

    def size(i: int) -> int:
        try:
            return physical[i].path.stat().st_size
        except OSError:
            return 0

    largest_first = sorted(range(len(physical)), key=lambda i: -size(i))  # no worker left alone with a big one
    out: dict[Any, FileResult] = {}
    try:
        pool = ProcessPoolExecutor(min(workers, len(physical)), mp_context=multiprocessing.get_context("fork"))
    except OSError:  # no processes to be had (a limit, no /dev/shm): threads
        pool = None
    try:
        if pool is not None:
            with pool:
                pending = [pool.submit(_load_forked, largest_first[k:k + 2]) for k in range(0, len(physical), 2)]
                for future in as_completed(pending):
                    for packed in future.result():
                        result = _unpack(packed)
                        out[result.ref.path] = result
                        if on_progress is not None:
                            on_progress(len(out), len(physical), result)
    except BrokenProcessPool:
        # A worker died (killed, out of memory): what it and the others did not send back is
        # loaded here, so the report still covers every file (and a file that kills a loader
        # fails here, where the user sees it), instead of waiting forever on a lost task.
        pass
    finally:
        _FORKED.clear()
    missing = [ref for ref in selection.refs if ref.path not in out]
    if missing:
        rest = load_many(dataclasses.replace(selection, refs=missing), FileResult.from_load, workers=workers)
        for path, result in rest.items():
            out[path] = result
            if on_progress is not None:
                on_progress(len(out), len(physical), result)
    return out


def _load_forked(indices: list[int]) -> list[_Packed]:
    """In a worker: load some files; their failures travel as (class, args, attributes)."""
    out: list[_Packed] = []
    for i in indices:
        result = FileResult.from_load(load_one(_FORKED["refs"][i], _FORKED["registry"]))
        failures = [(type(f), f.args, dict(f.__dict__)) for f in result.failures]
        out.append((dataclasses.replace(result, failures=[]), failures))
    return out


def _unpack(packed: _Packed) -> FileResult:
    result, failures = packed
    for cls, args, attributes in failures:
        failure = cls.__new__(cls)  # not __init__: the attributes are the worker's, exactly
        failure.args = args
        failure.__dict__.update(attributes)
        result.failures.append(failure)
    return result


def describe_guard(guard: Any) -> dict[str, Any]:
    """A declared guard as plain data: its type and every field that is not code."""
    out: dict[str, Any] = {"guard": type(guard).__name__}
    for f in dataclasses.fields(guard):
        value = getattr(guard, f.name)
        if callable(value) or value is None:
            continue
        if isinstance(value, Mapping):
            value = {k: list(v) if isinstance(v, tuple) else v for k, v in value.items()}
        elif isinstance(value, tuple):
            value = [list(v) if isinstance(v, tuple) else v for v in value]
        out[f.name] = value
    return out


def describe_family(name: str) -> dict[str, Any]:
    """A family's declaration as plain data (for docs and ``--json``)."""
    fam = registry()[name]
    return {
        "family": fam.name, "title": fam.title, "tier": fam.tier.value, "native_source": fam.native_source.value,
        "tables": [
            {"table": s.name, "phase": s.phase, "categorical": list(s.categorical), "discrete": list(s.discrete),
             "axes": list(s.axes), "seq_axis": s.seq_axis, "optional": sorted(s.optional),
             "head_axis": s.head_axis, "zero_latency": s.zero_latency_note,
             "latency": {"column": s.latency.column, "unit": s.latency.unit}, "renames": dict(s.renames),
             "unpivot": ({"key": s.unpivot.key, "phases": {p: {c: list(src) for c, src in cols.items()}
                                                           for p, cols in s.unpivot.phases.items()}}
                         if s.unpivot is not None else None),
             "derived": [{"column": d.name, "formula": d.formula, "keyed": d.name in s.key_columns,
                          "needs_system": d.needs_system} for d in s.derived],
             "carried": list(s.carried), "library": s.library,
             "quantities": [{"column": q.column, "scope": q.scope, "meaning": q.meaning, "beside": q.beside}
                            for q in s.quantities],
             "guards": [describe_guard(g) for g in s.guards]}
            for s in fam.tables
        ],
        "geometry": [f.name for f in fam.geometry],
        "requires_model": fam.requires_model, "requires_tp": fam.requires_tp, "stale_guard": fam.stale_guard,
        "model_head_axis": fam.model_head_axis, "work_model": "row roofline" if fam.roof is not None else "attention",
        "rationale": fam.rationale,
    }


__all__ = ["CheckReport", "FamilySummary", "FileResult", "check", "describe_family", "describe_guard", "family_of",
           "placement_finding"]
