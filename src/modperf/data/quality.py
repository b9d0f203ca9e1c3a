"""Data-quality checks: implausible latencies that the loader's guards let through.

Nothing here rejects a table; it reports, per file, points that look wrong:

* ``non_monotone`` -- along the batch axis (batch_size, or num_tokens) or the sequence axis
  (isl for context tables, step for generation tables), with every other key fixed, latency
  should not fall. A pair of neighbouring points is flagged when the later one is lower by
  more than the tolerance: ``previous > later * (1 + monotone_tolerance)``.
* ``spike`` -- an interior point of such a series that exceeds *both* neighbours by more than
  ``spike_factor``. (The fall right after a spike is counted as the spike, not again as
  non-monotone.)
* ``cross_file`` -- a point that disagrees by more than ``cross_factor`` (either way) with
  *every* other file that measured the same key: the neighbouring versions of the same backend
  (the one before and the one after) and every version of the other backends, on the same
  system. Keys are compared without ``kernel_source`` (each backend names its kernels
  differently); where a file has several kernels for one key, its fastest is compared.
  ``corroborated`` means two or more other files measured the key and all disagree -- the
  point, not its references, is the odd one out. Each file also gets the median ratio to each
  file it was compared with, which shows a backend that is slower across the board.

Every kind also needs an absolute difference above ``min_delta_ms``: microsecond kernels
jitter by more than 25% without meaning anything.

Per file, ``provenance`` notes say where a file's rows did not come from its folder's
collection: ``version_column`` (the rows record another version than the folder, e.g. an NCCL
table filed under the release a system selects but measured with another), and ``copy_of``
(every point equals another file's of the same system and table, bit for bit: an undeclared
reuse). Neither changes what the file answers; both are for the people who curate the data.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from ..base import errors as E
from .buckets import KeyedTable
from .catalog import TableRef
from .codes import combine, factorize
from .loader import Loaded, Scope, load_groups
from .versions import version_key

KINDS = ("non_monotone", "spike", "cross_file")
#: Categorical key columns left out when matching a key across files.
CROSS_FILE_IGNORED = ("kernel_source",)


@dataclass(frozen=True)
class Thresholds:
    #: relative fall allowed between neighbouring points of a series
    monotone_tolerance: float = 0.25
    #: an interior point above both neighbours by more than this factor is a spike
    spike_factor: float = 3.0
    #: disagreement with every other file measuring the key by more than this factor
    cross_factor: float = 10.0
    #: absolute difference (ms) below which nothing is flagged
    min_delta_ms: float = 0.01

    def validate(self) -> None:
        problems = {}
        if not (self.monotone_tolerance >= 0 and math.isfinite(self.monotone_tolerance)):
            problems["monotone_tolerance"] = self.monotone_tolerance
        if not (self.spike_factor > 1 and math.isfinite(self.spike_factor)):
            problems["spike_factor"] = self.spike_factor
        if not (self.cross_factor > 1 and math.isfinite(self.cross_factor)):
            problems["cross_factor"] = self.cross_factor
        if not (self.min_delta_ms >= 0 and math.isfinite(self.min_delta_ms)):
            problems["min_delta_ms"] = self.min_delta_ms
        if problems:
            raise E.OptionValueError(
                "quality thresholds out of range", values=problems,
                fix="tolerance and min delta must be >= 0; spike and cross factors must be > 1")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass
class Finding:
    kind: str
    bucket: dict[str, Any]
    point: dict[str, int]
    latency: float
    reference: float  # previous point (non_monotone), larger neighbour (spike), median of others (cross_file)
    ratio: float  # how far apart, >= 1
    axis: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        # a fall to a 0 ms point (allowed where a kernel is a no-op) has no finite ratio: null in JSON
        ratio = self.ratio if math.isfinite(self.ratio) else None
        return {"kind": self.kind, "axis": self.axis, "bucket": self.bucket, "point": self.point,
                "latency": self.latency, "reference": self.reference, "ratio": ratio, **self.detail}


@dataclass
class FileQuality:
    ref: TableRef
    family: str | None
    points: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    corroborated: int = 0  # cross_file findings that two or more other files contradict
    findings: list[Finding] = field(default_factory=list)  # worst first, capped per kind
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    failures: list[E.ModperfError] = field(default_factory=list)
    #: Where the rows did not come from the folder's own collection (version_column, copy_of).
    provenance: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_dict(self) -> dict[str, Any]:
        return {**self.ref.to_dict(), "family": self.family, "assessed": not self.failures, "points": self.points,
                "counts": self.counts, "cross_file_corroborated": self.corroborated,
                "findings": [f.to_dict() for f in self.findings], "comparisons": self.comparisons,
                "provenance": self.provenance, "failures": [f.to_dict() for f in self.failures]}


@dataclass
class QualityReport:
    thresholds: Thresholds
    files: list[FileQuality]
    seconds: float

    def totals(self) -> dict[str, Any]:
        counts = dict.fromkeys(KINDS, 0)
        for f in self.files:
            for k, v in f.counts.items():
                counts[k] += v
        notes: dict[str, int] = {}
        for f in self.files:
            for note in f.provenance:
                notes[note["kind"]] = notes.get(note["kind"], 0) + 1
        return {"files": len(self.files), "files_with_findings": sum(f.total > 0 for f in self.files),
                "files_not_assessed": sum(bool(f.failures) for f in self.files),
                "points": sum(f.points for f in self.files), **counts,
                "cross_file_corroborated": sum(f.corroborated for f in self.files),
                "provenance": dict(sorted(notes.items()))}

    def to_dict(self) -> dict[str, Any]:
        return {"thresholds": self.thresholds.to_dict(), "seconds": round(self.seconds, 3),
                "totals": self.totals(), "files": [f.to_dict() for f in self.files]}


# --- within one file ----------------------------------------------------------------------



def median(values: np.ndarray) -> float:
    """``float(np.median(values))`` of a float array, bit for bit, without ``np.median``: its
    first call imports ``numpy.ma`` (about 10-15 ms of a cold process's first quality note).
    The middle value, or the mean of the two middle values as ``np.mean`` takes it (their sum
    halved); NaN where any value is NaN (sorted last)."""
    ordered = np.sort(values, axis=None)
    n = ordered.size
    if n == 0:
        return math.nan
    if math.isnan(ordered[-1]):
        return math.nan
    # np.mean's sum of a few values starts from 0.0 (which turns a -0.0 into 0.0)
    if n % 2:
        return float(0.0 + ordered[n // 2])
    return float((0.0 + ordered[n // 2 - 1] + ordered[n // 2]) / 2.0)


def _bucket_of_points(kt: KeyedTable) -> np.ndarray:
    return np.repeat(np.arange(kt.n_buckets), np.diff(kt.offsets))


def _describe(kt: KeyedTable, bucket_of: np.ndarray, i: int) -> tuple[dict[str, Any], dict[str, int]]:
    b = int(bucket_of[i])
    return dict(zip(kt.key_names, kt.bucket_keys[b])), {a: int(v[i]) for a, v in kt.axes.items()}


def _series_checks(kt: KeyedTable, th: Thresholds, examples: int, out: FileQuality) -> None:
    bucket_of = _bucket_of_points(kt)
    axes = [kt.spec.axes[0]] + ([kt.spec.seq_axis] if kt.spec.seq_axis and kt.spec.seq_axis != kt.spec.axes[0] else [])
    found: dict[str, list[tuple[float, int, int, str]]] = {"non_monotone": [], "spike": []}
    for axis in axes:
        if axis not in kt.axes:
            continue
        codes, cards = [bucket_of], [max(kt.n_buckets, 1)]
        for other in kt.spec.axes:
            if other != axis:
                uniq, inv = factorize(kt.axes[other])
                # (int32 where it holds them: a 20M-point table has no room for int64 copies)
                codes.append(inv.astype(np.int32) if uniq.size < 2**31 else inv)
                del inv
                cards.append(max(int(uniq.size), 1))
        series = combine(codes, cards, kt.n_points)
        del codes
        order = np.lexsort((kt.axes[axis], series))
        s, lat = series[order], kt.latency[order]
        del series
        if lat.size < 2:
            continue
        same = s[1:] == s[:-1]
        prev, nxt = lat[:-1], lat[1:]
        spike = np.zeros(lat.size, dtype=bool)
        if lat.size >= 3:
            mid, neighbour = lat[1:-1], np.maximum(lat[:-2], lat[2:])
            spike[1:-1] = same[:-1] & same[1:] & (mid > th.spike_factor * neighbour) & \
                (mid - neighbour > th.min_delta_ms)
        with np.errstate(divide="ignore", invalid="ignore"):
            fall = same & (prev > nxt * (1 + th.monotone_tolerance)) & (prev - nxt > th.min_delta_ms) & ~spike[:-1]
        for j in np.flatnonzero(spike):
            neighbour = max(lat[j - 1], lat[j + 1])
            ratio = lat[j] / neighbour if neighbour > 0 else math.inf
            found["spike"].append((float(ratio), int(order[j]), int(order[j + 1]), axis))
        for j in np.flatnonzero(fall):
            ratio = prev[j] / nxt[j] if nxt[j] > 0 else math.inf
            found["non_monotone"].append((float(ratio), int(order[j + 1]), int(order[j]), axis))
    for kind, items in found.items():
        out.counts[kind] += len(items)
        items.sort(key=lambda x: -x[0])
        for ratio, i, ref_i, axis in items[:examples] if examples else items:
            bucket, point = _describe(kt, bucket_of, i)
            reference = float(kt.latency[ref_i])
            if kind == "spike":
                detail = {"neighbour": {axis: int(kt.axes[axis][ref_i])}}
            else:
                detail = {"previous": {axis: int(kt.axes[axis][ref_i])}}
            out.findings.append(Finding(kind, bucket, point, float(kt.latency[i]), reference,
                                        _finite(ratio), axis, detail))


def _finite(x: float) -> float:
    return float(x) if math.isfinite(x) else float("inf")


# --- across files -------------------------------------------------------------------------


@dataclass
class _Keys:
    """One file's points reduced to cross-file keys: sorted unique codes, the fastest latency
    per key, and the point that holds it."""

    codes: np.ndarray
    latency: np.ndarray
    point: np.ndarray


def _neighbours(refs: Sequence[TableRef], i: int) -> list[int]:
    me = refs[i]
    same = sorted((j for j, r in enumerate(refs) if r.backend == me.backend),
                  key=lambda j: version_key(refs[j].version))
    pos = same.index(i)
    out = [same[p] for p in (pos - 1, pos + 1) if 0 <= p < len(same)]
    out += [j for j, r in enumerate(refs) if r.backend != me.backend]
    return out


def _cross_file(tables: Sequence[KeyedTable], results: Sequence[FileQuality], th: Thresholds, examples: int) -> None:
    # joint codes: reduced bucket keys through a dict (buckets are few), axes factorized jointly
    joint: dict[tuple, int] = {}
    bucket_codes = []
    for kt in tables:
        ids = np.empty(kt.n_buckets, dtype=np.int64)
        for b, key in enumerate(kt.bucket_keys):
            reduced = tuple((n, v) for n, v in zip(kt.key_names, key) if n not in CROSS_FILE_IGNORED)
            ids[b] = joint.setdefault(reduced, len(joint))
        bucket_codes.append(ids[_bucket_of_points(kt)])
    axis_names = tables[0].spec.axes
    sizes = [kt.n_points for kt in tables]
    codes = [np.concatenate(bucket_codes)]
    cards = [max(len(joint), 1)]
    for a in axis_names:
        uniq, inv = factorize(np.concatenate([kt.axes[a] for kt in tables]))
        codes.append(inv)
        cards.append(max(int(uniq.size), 1))
    full = combine(codes, cards, int(sum(sizes)))
    keys: list[_Keys] = []
    offset = 0
    for kt, n in zip(tables, sizes):
        code, lat = full[offset:offset + n], kt.latency
        offset += n
        usable = np.flatnonzero(lat > 0)
        order = usable[np.lexsort((lat[usable], code[usable]))]
        cs = code[order]
        starts = np.flatnonzero(np.r_[True, cs[1:] != cs[:-1]]) if cs.size else np.zeros(0, np.int64)
        keys.append(_Keys(cs[starts], lat[order][starts], order[starts]))

    refs = [kt.ref for kt in tables]
    log_factor = math.log(th.cross_factor)
    for i, (kt, mine, out) in enumerate(zip(tables, keys, results)):
        n = mine.codes.size
        measured = np.zeros(n, dtype=np.int64)
        agreeing = np.zeros(n, dtype=np.int64)
        closest = np.full(n, np.inf)  # smallest |log ratio| over the other files
        ref_values: list[tuple[int, np.ndarray, np.ndarray]] = []
        for j in _neighbours(refs, i):
            other = keys[j]
            common, mi, oj = np.intersect1d(mine.codes, other.codes, assume_unique=True, return_indices=True)
            if not common.size:
                continue
            ratio = mine.latency[mi] / other.latency[oj]
            log_ratio = np.abs(np.log(ratio))
            close = (log_ratio <= log_factor) | (np.abs(mine.latency[mi] - other.latency[oj]) <= th.min_delta_ms)
            measured[mi] += 1
            agreeing[mi] += close
            closest[mi] = np.minimum(closest[mi], log_ratio)
            ref_values.append((j, mi, other.latency[oj]))
            out.comparisons.append({"with": refs[j].label, "shared_keys": int(common.size),
                                    "median_ratio": median(ratio)})
        flagged = np.flatnonzero((measured > 0) & (agreeing == 0))
        out.counts["cross_file"] += int(flagged.size)
        out.corroborated += int((measured[flagged] >= 2).sum())
        if not flagged.size:
            continue
        worst = flagged[np.argsort(-closest[flagged], kind="stable")]
        bucket_of = _bucket_of_points(kt)
        for k in worst[:examples] if examples else worst:
            others = []
            for j, mi, values in ref_values:
                hit = np.searchsorted(mi, k)
                # mi is sorted (intersect1d returns sorted common codes, so indices into mine are sorted)
                if hit < mi.size and mi[hit] == k:
                    others.append({"file": refs[j].label, "latency": float(values[hit])})
            reference = median(np.asarray([o["latency"] for o in others], dtype=np.float64))
            latency = float(mine.latency[k])
            bucket, point = _describe(kt, bucket_of, int(mine.point[k]))
            ratio = max(latency / reference, reference / latency)
            out.findings.append(Finding("cross_file", bucket, point, latency, reference, ratio, None,
                                        {"corroborated": len(others) >= 2, "others": others}))


# --- provenance -------------------------------------------------------------------------


def _version_note(kt: KeyedTable) -> dict[str, Any] | None:
    recorded = list(kt.recorded_versions)
    # (a library table filed in a framework folder: check's placement finding says it already)
    if kt.ref.version is None or not recorded or recorded == [kt.ref.version] or kt.ref.misplaced is not None:
        return None
    return {"kind": "version_column", "folder": kt.ref.version, "recorded": recorded}


def _signature(kt: KeyedTable) -> bytes:
    """Every point (bucket key, axis values, latency) in an order independent of how the file
    ordered its rows and encoded its strings."""
    by_key = sorted(range(kt.n_buckets), key=lambda b: tuple(map(str, kt.bucket_keys[b])))
    rank = np.empty(kt.n_buckets, dtype=np.int64)
    rank[by_key] = np.arange(kt.n_buckets)
    point_rank = rank[_bucket_of_points(kt)]
    order = np.lexsort([kt.latency, *(kt.axes[a] for a in reversed(kt.spec.axes)), point_rank])
    keys = "|".join(",".join(map(str, kt.bucket_keys[b])) for b in by_key).encode()
    arrays = [point_rank[order], *(kt.axes[a][order] for a in kt.spec.axes), kt.latency[order]]
    return keys + b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)


def _copies(tables: Sequence[KeyedTable], results: Sequence[FileQuality]) -> None:
    by_size: dict[int, list[int]] = {}
    for i, kt in enumerate(tables):
        by_size.setdefault(kt.n_points, []).append(i)
    for members in by_size.values():
        if len(members) < 2:
            continue
        signatures = {i: _signature(tables[i]) for i in members}
        for i in members:
            same = [tables[j].ref.label for j in members if j != i and signatures[j] == signatures[i]]
            if same:
                results[i].provenance.append({"kind": "copy_of", "identical_to": same})


# --- entry point --------------------------------------------------------------------------


def _reduced_keys(kt: KeyedTable) -> list[tuple[tuple[str, ...], tuple[Any, ...]]]:
    """Every bucket's key as the cross-file check matches it (without kernel_source): the
    names kept and the bucket's values of them."""
    kept = [i for i, n in enumerate(kt.key_names) if n not in CROSS_FILE_IGNORED]
    names = tuple(kt.key_names[i] for i in kept)
    return [(names, tuple([key[i] for i in kept])) for key in kt.bucket_keys]


def _bucket_subset(kt: KeyedTable, buckets: Sequence[int]) -> KeyedTable:
    """The keyed table holding only ``buckets`` (ascending), points in their original order:
    every check sees these buckets' series and keys as in the whole table."""
    if len(buckets) == kt.n_buckets:
        return kt
    picked = np.asarray(buckets, dtype=np.int64)
    starts, ends = kt.offsets[picked], kt.offsets[picked + 1]
    sizes = (ends - starts).astype(np.int64)
    offsets = np.zeros(picked.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    # every point of the picked buckets: its bucket's start plus its place within the bucket
    rows = np.repeat(starts.astype(np.int64) - offsets[:-1], sizes) + np.arange(int(offsets[-1]), dtype=np.int64)
    return replace(
        kt, bucket_keys=[kt.bucket_keys[b] for b in buckets], offsets=offsets,
        axes={a: v[rows] for a, v in kt.axes.items()}, latency=kt.latency[rows], sources=kt.sources[rows],
        bucket_models=[kt.bucket_models[b] for b in buckets], bucket_native=kt.bucket_native[picked],
        bucket_local=kt.bucket_local[picked],
        duplicate_spread=None if kt.duplicate_spread is None else kt.duplicate_spread[rows],
        bucket_columns=None, _index={})


def assess_buckets(tables: Sequence[KeyedTable], buckets: Sequence[int],
                   thresholds: Thresholds = Thresholds()) -> list[Finding]:
    """Every finding of ``tables[0]`` on its ``buckets``, the others being the files it is
    compared with: the findings ``assess_tables(tables, examples=0)[0]`` lists on those buckets,
    worst first, without assessing the rest of the table (a query's notes, on a table of
    millions of rows, look at the group it stands on).

    The series checks see a bucket's series whole; the cross-file check matches a key without
    kernel_source and compares each file's fastest point per key, so every file keeps each
    bucket whose key, so reduced, is one of these buckets' (and every file stays in the list:
    which versions are neighbours depends on all of them)."""
    thresholds.validate()
    mine = tables[0]
    wanted = set(buckets)
    mine_reduced = _reduced_keys(mine)
    reduced = {mine_reduced[b] for b in wanted}
    subsets = [_bucket_subset(kt, [b for b, r in enumerate(mine_reduced if i == 0 else _reduced_keys(kt))
                                   if r in reduced]) for i, kt in enumerate(tables)]
    out = FileQuality(mine.ref, mine.family.name, subsets[0].n_points)
    _series_checks(subsets[0], thresholds, 0, out)
    if mine.ref.system is not None and mine.ref.backend is not None:
        # the files assess_tables compares with tables[0]: those sharing its (system, table)
        members = [i for i, kt in enumerate(tables) if kt.ref.system is not None and kt.ref.backend is not None
                   and (kt.ref.system, kt.ref.table) == (mine.ref.system, mine.ref.table)]
        if len(members) >= 2:
            compared = [FileQuality(tables[i].ref, tables[i].family.name) for i in members]
            compared[members.index(0)] = out
            _cross_file([subsets[i] for i in members], compared, thresholds, 0)
    names = mine.key_names
    keep = {tuple(mine.bucket_keys[b]) for b in wanted}
    found = [f for f in out.findings if tuple(f.bucket.get(n) for n in names) in keep]
    found.sort(key=lambda f: (KINDS.index(f.kind), not f.detail.get("corroborated", False), -f.ratio))
    return found


def assess_tables(tables: Sequence[KeyedTable], thresholds: Thresholds = Thresholds(),
                  examples: int = 10) -> list[FileQuality]:
    """Every check on already-loaded tables; files sharing (system, table) are compared."""
    thresholds.validate()
    results = [FileQuality(kt.ref, kt.family.name, kt.n_points) for kt in tables]
    for kt, out in zip(tables, results):
        _series_checks(kt, thresholds, examples, out)
        note = _version_note(kt)
        if note is not None:
            out.provenance.append(note)
    groups: dict[tuple, list[int]] = {}
    for i, kt in enumerate(tables):
        if kt.ref.system is not None and kt.ref.backend is not None:
            groups.setdefault((kt.ref.system, kt.ref.table), []).append(i)
    for members in groups.values():
        if len(members) >= 2:
            _cross_file([tables[i] for i in members], [results[i] for i in members], thresholds, examples)
            _copies([tables[i] for i in members], [results[i] for i in members])
    for out in results:
        # worst first; cross-file findings that several files contradict before two-file disagreements
        out.findings.sort(key=lambda f: (KINDS.index(f.kind), not f.detail.get("corroborated", False), -f.ratio))
    return results


def group_key(ref: TableRef) -> tuple[str, str]:
    """Files compared with each other: one system's versions and backends of one table."""
    return (ref.system, ref.table) if ref.system is not None else ("", str(ref.path))


def assess_loaded(group: Sequence[Loaded], thresholds: Thresholds = Thresholds(),
                  examples: int = 10) -> list[FileQuality]:
    """Findings for one group of loaded tables (one per table, in order); a table that failed
    to load is listed as not assessed."""
    ok = [ld.keyed for ld in group if ld.keyed is not None]
    assessed = iter(assess_tables(ok, thresholds, examples))
    out = []
    for ld in group:
        if ld.keyed is not None:
            out.append(next(assessed))
        else:
            out.append(FileQuality(ld.ref, ld.family.name if ld.family else None, failures=ld.failures))
    return out


def sort_files(files: list[FileQuality]) -> list[FileQuality]:
    return sorted(files, key=lambda f: (f.ref.system or "", f.ref.backend or "", version_key(f.ref.version),
                                        f.ref.table))


def assess(
    paths: Sequence[str] | None = None,
    *,
    data_root: str | None = None,
    table: str | None = None,
    model_configs: Sequence[str] | None = None,
    thresholds: Thresholds = Thresholds(),
    examples: int = 10,
    workers: int | None = None,
    on_progress: Callable[[int, int, Any], None] | None = None,
    scope: Scope | None = None,
) -> QualityReport:
    """Quality findings for every declared table file (or the given files/folders).
    Tables are loaded one (system, table) group at a time, so memory stays bounded.
    (``modperf check --quality`` assesses the tables its own load produced.)"""
    thresholds.validate()
    start = time.perf_counter()
    scope = scope or Scope.of(paths, data_root=data_root, table=table, model_configs=model_configs)
    files = load_groups(scope.select(), group_key, lambda group: assess_loaded(group, thresholds, examples),
                        workers=workers, on_progress=on_progress)
    return QualityReport(thresholds, sort_files(files), time.perf_counter() - start)


__all__ = ["KINDS", "FileQuality", "Finding", "QualityReport", "Thresholds", "assess", "assess_buckets",
           "assess_loaded", "assess_tables", "group_key"]
