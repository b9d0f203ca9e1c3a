"""Alias de-duplication: the model column as provenance.

A row's **identity** is (table, native, the family's module geometry, the categorical/dtype
key columns, the discrete keys, local num_heads, the axis values). Model names that share a
native and a geometry are *aliases* of one module; their rows at one identity measure the same
thing. (Inside a table that loads, one native has one geometry -- the collision guard rejects
anything else -- so the native stands for the (native, geometry) pair; in local-only tables
the native is the one the row records, num_heads * tp_size or the model's config.)

For every file this module reports the alias groups, the duplicate rows (alias duplicates:
the same identity under another name; repeats: the same identity again under the same name),
and the spread between measurements of one identity: relative difference max/min - 1, its
median, p95 and max, and the identities whose spread exceeds a tolerance
(:data:`DEFAULT_TOLERANCE`).

``write`` produces de-duplicated tables: one row per identity, whose latency is the lower
median of the identity's rows -- the loader's duplicate rule -- so the written table answers
every query with the latency the loader picked from the original. The row kept is the one
that measured that latency (its power and other columns come along); ``model`` becomes the
group's canonical id and ``measured_by`` lists every name that measured the identity.
Canonical id: the alias that measured the most identities in the file, then the most rows,
then the shortest id, then the alphabetically first; ``prefer`` names win over that rule.
Every written file is verified before it is put in place: it must load with no failure, hold
no duplicate identity, and key exactly the buckets, points and latencies of its source.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..base import errors as E
from ..base import limits
from ..base.atomic import sweep, write_atomically
from ..base.meta import __version__
from ..data.buckets import NATIVE, KeyedTable
from ..data.catalog import PARQUET_SUFFIX, TableRef
from ..data.codes import combine, factorize
from ..data.families.base import ARCHITECTURE, HEADS, MEASURED_BY, MODEL
from ..data.loader import Loaded, Scope, load_many, load_one
from ..data.parquet_files import parquet_writer, written_by_modperf
from ..data.reader import read_schema, stored_type
from ..data.validate import ValidatedTable
from ..specs.models import ModelRegistry

#: Relative difference (max/min - 1) between measurements of one identity above which the
#: identity is listed. Alias measurements of the fixtures' vllm 0.22.0 grids differ by a
#: median of 0.3-0.5% and a p95 of 1.5-6%; 10% is well beyond run-to-run noise there.
DEFAULT_TOLERANCE = 0.10
#: How many over-tolerance identities a file report lists, widest first (0: all of them; the
#: counts are always complete).
DEFAULT_EXAMPLES = 10


def _num(x: float | None) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


@dataclass
class Spread:
    """Relative difference (max/min - 1) between measurements of the same identity."""

    keys: int  # identities with two or more measurements compared
    median: float | None = None
    p95: float | None = None
    max: float | None = None
    over_tolerance: int = 0

    @classmethod
    def of(cls, rel: np.ndarray, tolerance: float) -> Spread:
        if not rel.size:
            return cls(0)
        return cls(int(rel.size), float(np.median(rel)), float(np.percentile(rel, 95)), float(rel.max()),
                   int((rel > tolerance).sum()))

    def to_dict(self) -> dict[str, Any]:
        return {"keys": self.keys, "median_rel_diff": _num(self.median), "p95_rel_diff": _num(self.p95),
                "max_rel_diff": _num(self.max), "over_tolerance": self.over_tolerance}


@dataclass
class AliasGroup:
    """Model names that share one native and one module geometry in a file."""

    native: int
    models: list[str]
    canonical: str
    rows: dict[str, int]  # raw rows per name
    keys: dict[str, int]  # identities each name measured
    shared_keys: int  # identities measured under two or more of the names
    spread: Spread  # between the names' measurements (each name's lower median) of one identity
    geometry: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"native": self.native, "models": self.models, "canonical": self.canonical, "rows": self.rows,
                "keys": self.keys, "shared_keys": self.shared_keys, "spread": self.spread.to_dict(),
                "geometry": self.geometry}


@dataclass
class OverTolerance:
    """One identity whose measurements differ by more than the tolerance."""

    kind: str  # "alias" (names disagree) | "repeat" (one name's repeated rows disagree)
    key: dict[str, Any]
    rel_diff: float
    latencies: dict[str, list[float]]  # name (or "" without a model column) -> its rows' latencies

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "key": self.key, "rel_diff": _num(self.rel_diff), "latencies": self.latencies}


@dataclass
class WriteResult:
    """What ``write`` did with one table: ``verified`` is True exactly when the verified file
    took its name; otherwise ``failures`` say why (verification, a full disk, a permission)
    and the destination holds what it held before."""

    destination: str
    rows_written: int
    verified: bool
    failures: list[E.ModperfError] = field(default_factory=list)

    @property
    def written(self) -> bool:
        return self.verified and not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {"destination": self.destination, "rows_written": self.rows_written if self.written else 0,
                "written": self.written, "verified": self.verified, "failures": [f.to_dict() for f in self.failures]}


@dataclass
class FileDedupe:
    """The alias/duplicate audit of one table file."""

    ref: TableRef
    family: str | None
    rows: int = 0
    identities: int = 0
    duplicate_rows: int = 0  # rows - identities: what a de-duplicated table drops
    alias_duplicate_rows: int = 0  # per identity: (names measuring it) - 1
    repeat_rows: int = 0  # per identity: rows - names (same name, same identity again)
    alias_keys: int = 0  # identities measured under two or more names
    repeat_keys: int = 0  # identities some name measured more than once
    models: dict[str, int] = field(default_factory=dict)  # name -> native
    alias_groups: list[AliasGroup] = field(default_factory=list)
    repeat_spread: Spread = field(default_factory=lambda: Spread(0))
    over_tolerance: list[OverTolerance] = field(default_factory=list)  # worst first, capped
    failures: list[E.ModperfError] = field(default_factory=list)
    written: WriteResult | None = None
    seconds: float = 0.0
    # what ``write`` needs: the kept row of every identity, in file order, and its names
    _kept_rows: np.ndarray | None = field(default=None, repr=False)
    _kept_names: pa.ListArray | None = field(default=None, repr=False)
    _canonical_of: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return not self.failures and (self.written is None or self.written.verified)

    @property
    def over_tolerance_keys(self) -> int:
        return sum(g.spread.over_tolerance for g in self.alias_groups) + self.repeat_spread.over_tolerance

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.ref.to_dict(), "family": self.family, "ok": self.ok, "rows": self.rows,
            "identities": self.identities, "duplicate_rows": self.duplicate_rows,
            "alias_duplicate_rows": self.alias_duplicate_rows, "repeat_rows": self.repeat_rows,
            "alias_keys": self.alias_keys, "repeat_keys": self.repeat_keys, "models": self.models,
            "alias_groups": [g.to_dict() for g in self.alias_groups],
            "repeat_spread": self.repeat_spread.to_dict(),
            "over_tolerance_keys": self.over_tolerance_keys,
            "over_tolerance": [o.to_dict() for o in self.over_tolerance],
            "written": self.written.to_dict() if self.written else None,
            "failures": [f.to_dict() for f in self.failures],
        }


@dataclass
class DedupeReport:
    files: list[FileDedupe]
    tolerance: float
    out_dir: str | None
    seconds: float
    problems: list[E.ModperfError] = field(default_factory=list)  # of the data root, not one table

    @property
    def failures(self) -> list[E.ModperfError]:
        out: list[E.ModperfError] = list(self.problems)
        for f in self.files:
            out += f.failures
            if f.written is not None:
                out += f.written.failures
        return out

    @property
    def ok(self) -> bool:
        return not self.problems and all(f.ok for f in self.files)

    def totals(self) -> dict[str, int]:
        return {
            "files": len(self.files), "files_failed": sum(not f.ok for f in self.files),
            "rows": sum(f.rows for f in self.files), "identities": sum(f.identities for f in self.files),
            "duplicate_rows": sum(f.duplicate_rows for f in self.files),
            "alias_duplicate_rows": sum(f.alias_duplicate_rows for f in self.files),
            "repeat_rows": sum(f.repeat_rows for f in self.files),
            "files_with_aliases": sum(bool(f.alias_groups) for f in self.files),
            "over_tolerance_keys": sum(f.over_tolerance_keys for f in self.files),
            "files_written": sum(f.written is not None and f.written.verified for f in self.files),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "tolerance": self.tolerance, "out_dir": self.out_dir,
                "seconds": round(self.seconds, 3), "totals": self.totals(),
                "problems": [p.to_dict() for p in self.problems], "files": [f.to_dict() for f in self.files]}


# --- identity -----------------------------------------------------------------------------


@dataclass
class _Identity:
    names: tuple[str, ...]  # identity columns, in order (``native`` where the row has one)
    code: np.ndarray  # dense identity id per row, 0..n_ids-1
    n_ids: int


def _identity(vt: ValidatedTable) -> _Identity:
    spec = vt.spec
    names: list[str] = []
    codes: list[np.ndarray] = []
    cards: list[int] = []
    for name in vt.present(spec.categorical):
        cat = vt.categorical[name]
        names.append(name)
        codes.append(cat.codes.astype(np.int64))
        cards.append(max(len(cat.values), 1))
    int_columns: list[tuple[str, np.ndarray]] = [(n, vt.integers[n]) for n in vt.present(spec.discrete)]
    if vt.native is not None:
        int_columns.append((NATIVE, vt.native))
    int_columns += [(HEADS, vt.integers[HEADS])] + [(a, vt.integers[a]) for a in spec.axes]
    for name, column in int_columns:
        uniq, inv = factorize(column)
        names.append(name)
        codes.append(inv)
        cards.append(max(int(uniq.size), 1))
    combined = combine(codes, cards, vt.n_rows)
    uniq, dense = factorize(combined)
    return _Identity(tuple(names), dense, int(uniq.size))


def _key_of_row(vt: ValidatedTable, names: Sequence[str], row: int) -> dict[str, Any]:
    key: dict[str, Any] = {}
    for name in names:
        if name in vt.categorical:
            cat = vt.categorical[name]
            key[name] = cat.values[int(cat.codes[row])]
        elif name == NATIVE:
            assert vt.native is not None
            key[name] = int(vt.native[row])
        else:
            key[name] = int(vt.integers[name][row])
    return key


def _canonical(models: Sequence[str], keys: dict[str, int], rows: dict[str, int], prefer: Sequence[str]) -> str:
    for name in prefer:
        if name in models:
            return name
    return min(models, key=lambda m: (-keys.get(m, 0), -rows.get(m, 0), len(m), m))


def audit_table(loaded: Loaded, *, tolerance: float = DEFAULT_TOLERANCE, prefer: Sequence[str] = (),
                examples: int = DEFAULT_EXAMPLES, keep_for_write: bool = False) -> FileDedupe:
    """The alias/duplicate audit of one loaded table (see the module docstring)."""
    start = time.perf_counter()
    out = FileDedupe(loaded.ref, loaded.family.name if loaded.family else None, failures=list(loaded.failures))
    vt = loaded.validated
    if vt is None:
        if loaded.keyed is not None:  # a caller's mistake, not the data's: never an empty audit
            raise ValueError("audit_table reads the validated rows: load the table with keep_validated=True")
        return out
    n = vt.n_rows
    out.rows = n
    ident = _identity(vt)
    out.identities = ident.n_ids
    out.duplicate_rows = n - ident.n_ids
    latency = vt.latency
    model = vt.model

    if model is not None:
        # names coded by alphabetical rank, so every per-identity name list comes out sorted
        names_sorted = sorted(model.values)
        n_models = max(len(names_sorted), 1)
        rank = np.empty(len(model.values), dtype=np.int64)
        rank[np.argsort(np.array(model.values, dtype=object), kind="stable")] = np.arange(len(model.values))
        name_code = rank[model.codes]
    else:
        names_sorted = [""]
        n_models = 1
        name_code = np.zeros(n, dtype=np.int64)
    # rows grouped by (identity, name), latencies ascending inside each group
    pair = ident.code * n_models + name_code
    order = np.lexsort((latency, pair))
    pair_sorted, lat_sorted = pair[order], latency[order]
    pair_starts = np.flatnonzero(np.r_[True, pair_sorted[1:] != pair_sorted[:-1]]) if n else np.zeros(0, np.int64)
    pair_sizes = np.diff(np.append(pair_starts, n))
    pair_ident = pair_sorted[pair_starts] // n_models
    pair_name = pair_sorted[pair_starts] % n_models
    pair_low = lat_sorted[pair_starts]
    pair_high = lat_sorted[pair_starts + pair_sizes - 1]
    pair_median = lat_sorted[pair_starts + (pair_sizes - 1) // 2]  # the loader's lower median

    names_per_ident = np.bincount(pair_ident, minlength=ident.n_ids)
    rows_per_ident = np.bincount(ident.code, minlength=ident.n_ids)
    out.alias_duplicate_rows = int((names_per_ident - 1).sum()) if model is not None else 0
    out.repeat_rows = out.duplicate_rows - out.alias_duplicate_rows
    out.alias_keys = int((names_per_ident > 1).sum()) if model is not None else 0
    repeated_pair = pair_sizes > 1
    out.repeat_keys = int(np.unique(pair_ident[repeated_pair]).size) if repeated_pair.any() else 0

    with np.errstate(divide="ignore", invalid="ignore"):
        repeat_rel = np.where(pair_high > 0, pair_high / pair_low - 1.0, 0.0)[repeated_pair]
    out.repeat_spread = Spread.of(repeat_rel, tolerance)
    over = repeat_rel > tolerance
    flagged: list[tuple[float, str, int]] = [
        (float(r), "repeat", int(p)) for r, p in zip(repeat_rel[over], np.flatnonzero(repeated_pair)[over])
    ]

    # alias spread: per identity with 2+ names, max/min of the names' lower medians
    ident_rel = np.zeros(ident.n_ids)
    if model is not None and pair_ident.size:
        id_starts = np.flatnonzero(np.r_[True, pair_ident[1:] != pair_ident[:-1]])
        lo = np.minimum.reduceat(pair_median, id_starts)
        hi = np.maximum.reduceat(pair_median, id_starts)
        with np.errstate(divide="ignore", invalid="ignore"):
            ident_rel[pair_ident[id_starts]] = np.where(hi > 0, hi / lo - 1.0, 0.0)

    # alias groups: names of one native (one geometry, by the collision guard)
    if model is not None:
        used = np.bincount(name_code, minlength=n_models)
        keys_per_name = np.bincount(pair_name, minlength=n_models)
        by_native: dict[int, list[int]] = {}
        for code, name in enumerate(names_sorted):
            if used[code] and name in vt.configs:
                nat = vt.configs[name].native_heads
                out.models[name] = nat
                by_native.setdefault(nat, []).append(code)
        # any row of an identity tells its native (all its rows share it)
        some_row = np.zeros(ident.n_ids, dtype=np.int64)
        some_row[ident.code] = np.arange(n)
        ident_native = vt.native[some_row] if vt.native is not None else np.full(ident.n_ids, -1)
        multi = names_per_ident > 1
        for nat, codes in sorted(by_native.items()):
            names = [names_sorted[c] for c in codes]
            rows = {names_sorted[c]: int(used[c]) for c in codes}
            keys = {names_sorted[c]: int(keys_per_name[c]) for c in codes}
            canonical = _canonical(names, keys, rows, prefer)
            for name in names:
                out._canonical_of[name] = canonical
            if len(names) < 2:
                continue
            shared = multi & (ident_native == nat)
            geometry = dict(vt.geometry.get(canonical, ()))
            out.alias_groups.append(AliasGroup(nat, names, canonical, rows, keys, int(shared.sum()),
                                               Spread.of(ident_rel[shared], tolerance), geometry))
        for i in np.flatnonzero(multi & (ident_rel > tolerance)):
            flagged.append((float(ident_rel[i]), "alias", int(i)))

    # the worst over-tolerance identities, with every measurement behind them
    flagged.sort(key=lambda f: -f[0])
    if flagged:
        row_order = np.lexsort((latency, ident.code))
        row_starts = np.searchsorted(ident.code[row_order], np.arange(ident.n_ids))
        for rel, kind, index in flagged[:examples] if examples else flagged:
            ident_i = index if kind == "alias" else int(pair_ident[index])
            rows_of = row_order[row_starts[ident_i]:row_starts[ident_i] + rows_per_ident[ident_i]]
            measured: dict[str, list[float]] = {}
            for r in rows_of:
                name = model.values[int(model.codes[r])] if model is not None else ""
                measured.setdefault(name, []).append(float(latency[r]))
            if kind == "repeat" and model is not None:
                name = names_sorted[int(pair_name[index])]
                measured = {name: measured[name]}
            out.over_tolerance.append(OverTolerance(kind, _key_of_row(vt, ident.names, int(rows_of[0])), rel,
                                                    measured))

    # the row each identity keeps: the one holding the lower median over all its rows
    id_order = np.lexsort((latency, ident.code))
    id_sorted = ident.code[id_order]
    id_starts = np.flatnonzero(np.r_[True, id_sorted[1:] != id_sorted[:-1]]) if n else np.zeros(0, np.int64)
    id_sizes = np.diff(np.append(id_starts, n))
    kept = id_order[id_starts + (id_sizes - 1) // 2]
    out._kept_rows = np.sort(kept)
    if model is not None and keep_for_write:
        # the names behind each identity as one list array (pairs are sorted by identity, then name)
        offsets = np.searchsorted(pair_ident, np.arange(ident.n_ids + 1)).astype(np.int32)
        values = pa.array(names_sorted, type=pa.string()).take(pa.array(pair_name))
        per_ident = pa.ListArray.from_arrays(pa.array(offsets), values)
        out._kept_names = per_ident.take(pa.array(ident.code[out._kept_rows]))
    out.seconds = time.perf_counter() - start
    return out


# --- writing ------------------------------------------------------------------------------


def destination(ref: TableRef, out_dir: Path) -> Path:
    """Where ``write`` puts a table: the standard layout under OUT_DIR when the source sits in
    one, else the file name (always parquet)."""
    name = f"{ref.table}{PARQUET_SUFFIX}"
    if ref.system is not None:
        return out_dir / ref.system / str(ref.family_dir) / str(ref.backend) / str(ref.version) / name
    return out_dir / name


#: The stamp dedupe puts in the files it writes (modperf.data.parquet_files.OWNER_KEY).
OWNER = f"modperf {__version__} dedupe"


def plan_destinations(refs: Sequence[TableRef], out_dir: Path, source_root: Path | None, *,
                      force: bool = False) -> dict[Path, Path]:
    """Source -> destination for every table, refusing anything that could clobber a source,
    and (without ``force``) any existing file in OUT_DIR that modperf did not write."""
    if out_dir.expanduser().exists() and not out_dir.expanduser().is_dir():
        raise E.DedupeOutputError("OUT_DIR is not a folder", file=out_dir,
                                  fix="pass a folder (it is created if missing)")
    out_abs = out_dir.expanduser().resolve()
    if source_root is not None:
        root = source_root.resolve()
        if out_abs == root or root in out_abs.parents:
            raise E.DedupeOutputError(
                "OUT_DIR is inside the data root being audited", values={"out_dir": str(out_abs),
                                                                         "data_root": str(root)},
                fix="write de-duplicated tables outside the data root, then point --data-root at OUT_DIR")
    plan: dict[Path, Path] = {}
    taken: dict[Path, Path] = {}
    sources = {r.path.resolve() for r in refs}
    for ref in refs:
        dest = destination(ref, out_abs)
        if dest in sources or (dest.exists() and any(dest.samefile(s) for s in sources if s.exists())):
            raise E.DedupeOutputError("de-duplicated table would overwrite a source table", file=dest,
                                      fix="choose an OUT_DIR that holds none of the tables being read")
        if dest in taken:
            raise E.DedupeOutputError(
                "two source tables map to one destination", file=dest,
                values={"sources": [str(taken[dest]), str(ref.path)]},
                fix="audit tables laid out system/family/backend/version/, or write them one at a time")
        taken[dest] = ref.path
        plan[ref.path] = dest
    foreign = [d for d in plan.values() if (d.exists() or d.is_symlink()) and not written_by_modperf(d)]
    if foreign and not force:
        raise E.OutputNotOwnedError(
            f"{len(foreign)} file(s) in OUT_DIR were not written by modperf dedupe and would be replaced",
            file=foreign[0], values={"files": [str(d) for d in foreign]},
            fix="pass --force to replace them, or write to another folder (nothing was written)")
    return plan


def _names_column(names: pa.ListArray, existing: pa.ChunkedArray | None, kept: np.ndarray) -> pa.Array:
    """``measured_by`` for the kept rows. A source that already carries the column (a table
    written by an earlier dedupe) keeps those names too: the union over the identity's rows
    would need them all, so rows there are merged name lists of the kept row only -- an
    earlier dedupe left one row per identity, so nothing is lost."""
    if existing is None:
        return names
    previous = existing.take(pa.array(kept)).to_pylist()
    merged = [sorted(set(a) | set(b or ())) for a, b in zip(names.to_pylist(), previous)]
    return pa.array(merged, type=pa.list_(pa.string()))


def deduplicated_table(audit: FileDedupe, arrow: pa.Table, schema: pa.Schema) -> pa.Table:
    """The de-duplicated arrow table of an audited file (every source column, one row per identity)."""
    assert audit._kept_rows is not None
    kept = audit._kept_rows
    table = arrow.take(pa.array(kept))
    columns = {name: table.column(name) for name in table.column_names}
    if audit._kept_names is not None and MODEL in columns:
        # rename through the dictionary: one lookup per distinct name, not per row
        encoded = pc.dictionary_encode(pc.cast(columns[MODEL], pa.string()).combine_chunks())
        canonical = [audit._canonical_of.get(m, m) for m in encoded.dictionary.to_pylist()]
        columns[MODEL] = pa.chunked_array([pa.DictionaryArray.from_arrays(
            encoded.indices, pa.array(canonical, type=pa.string())).cast(pa.string())])
        if ARCHITECTURE in columns:
            # the canonical model's own architecture label (aliases may be labelled differently)
            source_models = pc.cast(arrow.column(MODEL), pa.string())
            source_arch = pc.cast(arrow.column(ARCHITECTURE), pa.string())
            arch = [source_arch[pc.index(source_models, name).as_py()].as_py() for name in canonical]
            columns[ARCHITECTURE] = pa.chunked_array([pa.DictionaryArray.from_arrays(
                encoded.indices, pa.array(arch, type=pa.string())).cast(pa.string())])
        existing = arrow.column(MEASURED_BY) if MEASURED_BY in arrow.column_names else None
        columns[MEASURED_BY] = pa.chunked_array([_names_column(audit._kept_names, existing, kept)])
    fields = list(schema)
    if MEASURED_BY in columns and MEASURED_BY not in schema.names:
        fields.append(pa.field(MEASURED_BY, pa.list_(pa.string())))
    out_schema = pa.schema(fields)
    arrays = [pc.cast(columns[f.name], f.type) for f in out_schema]
    return pa.Table.from_arrays(arrays, schema=out_schema)


def _same_answers(before: KeyedTable, after: KeyedTable) -> dict[str, Any] | None:
    """None when two keyed tables hold the same buckets, points and latencies bit for bit;
    otherwise what differs first. Bucket order is not compared: it follows the order in which
    categorical values first appear in the file, which dropping rows can change."""
    if before.key_names != after.key_names:
        return {"what": "key columns", "before": list(before.key_names), "after": list(after.key_names)}
    if set(before.bucket_keys) != set(after.bucket_keys):
        missing = sorted(set(before.bucket_keys) - set(after.bucket_keys), key=str)[:3]
        extra = sorted(set(after.bucket_keys) - set(before.bucket_keys), key=str)[:3]
        return {"what": "buckets", "missing": [dict(zip(before.key_names, k)) for k in missing],
                "extra": [dict(zip(after.key_names, k)) for k in extra]}
    for b, key in enumerate(before.bucket_keys):
        a = after.bucket_id(key)
        assert a is not None
        lo, hi = int(before.offsets[b]), int(before.offsets[b + 1])
        alo, ahi = int(after.offsets[a]), int(after.offsets[a + 1])
        bucket = dict(zip(before.key_names, key))
        if hi - lo != ahi - alo:
            return {"what": "points", "bucket": bucket, "before": hi - lo, "after": ahi - alo}
        for axis, values in before.axes.items():
            if not np.array_equal(values[lo:hi], after.axes[axis][alo:ahi]):
                return {"what": f"axis {axis}", "bucket": bucket}
        lat_b, lat_a = before.latency[lo:hi], after.latency[alo:ahi]
        if not np.array_equal(lat_b, lat_a):
            i = int(np.flatnonzero(lat_b != lat_a)[0])
            return {"what": "latency", "bucket": bucket,
                    "point": {ax: int(v[lo + i]) for ax, v in before.axes.items()},
                    "before": float(lat_b[i]), "after": float(lat_a[i])}
    return None


def write_table(loaded: Loaded, audit: FileDedupe, dest: Path, registry: ModelRegistry,
                *, tolerance: float = DEFAULT_TOLERANCE) -> WriteResult:
    """Write one de-duplicated table through the one atomic path (:mod:`modperf.base.atomic`): the
    temporary file beside ``dest`` is verified before it takes its name; one that fails
    verification is removed, never placed."""
    assert loaded.arrow is not None and loaded.keyed is not None
    schema = pa.schema([pa.field(f.name, stored_type(f.type)) for f in read_schema(loaded.ref.path)])
    table = deduplicated_table(audit, loaded.arrow, schema)
    failures: list[E.ModperfError] = []
    keyed = loaded.keyed

    def verify(temp: Path) -> None:
        check_ref = TableRef(loaded.ref.table, temp, loaded.ref.system, loaded.ref.family_dir,
                             loaded.ref.backend, loaded.ref.version)
        again = load_one(check_ref, registry, keep_validated=True)
        fix = "this is a modperf bug: report it with the source file; nothing was written"
        if again.keyed is None:
            failures.append(E.DedupeVerifyError(
                "de-duplicated table does not pass the loader's guards", file=dest,
                values={"source": str(loaded.ref.path), "failures": [f.kind for f in again.failures],
                        "first": str(again.failures[0]) if again.failures else None}, fix=fix))
        else:
            recheck = audit_table(again, tolerance=tolerance)
            if recheck.duplicate_rows:
                failures.append(E.DedupeVerifyError(
                    "de-duplicated table still holds duplicate identities", file=dest,
                    values={"source": str(loaded.ref.path), "duplicate_rows": recheck.duplicate_rows}, fix=fix))
            diff = _same_answers(keyed, again.keyed)
            if diff is not None:
                local_merge = diff["what"] == "latency" and keyed.family.tier.value == "local"
                failures.append(E.DedupeVerifyError(
                    "de-duplicated table would answer differently from its source", file=dest,
                    values={"source": str(loaded.ref.path), **diff},
                    fix=("natives of this local-only table share a local key and one of them repeats it: one row "
                         "per native cannot reproduce the loader's lower median over all of them; keep the source "
                         "file as it is") if local_merge else fix))
        if failures:
            raise failures[0]

    try:
        write_atomically(dest, parquet_writer(table, owner=OWNER), overwrite=True, verify=verify)
    except E.DedupeVerifyError:
        return WriteResult(str(dest), table.num_rows, False, failures)
    except E.ModperfError as exc:  # a full disk, a permission, a target that changed: this table only
        return WriteResult(str(dest), table.num_rows, False, [exc])
    return WriteResult(str(dest), table.num_rows, True)


# --- entry point --------------------------------------------------------------------------


def dedupe(
    paths: Sequence[str] | None = None,
    *,
    data_root: str | None = None,
    table: str | None = None,
    model_configs: Sequence[str] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    prefer: Sequence[str] = (),
    examples: int = DEFAULT_EXAMPLES,
    write: str | os.PathLike[str] | None = None,
    force: bool = False,
    workers: int | None = None,
    on_progress: Callable[[int, int, FileDedupe], None] | None = None,
) -> DedupeReport:
    """Audit aliases and duplicates in every table file with the model's head axis (or the given files and
    folders); with ``write``, also write de-duplicated, verified tables under that folder
    (``force``: also replace files there that modperf did not write). Raises only for usage
    errors; data problems, and tables that could not be written (a full disk), are in the
    report, which says which tables were written."""
    limits.check_int("examples", examples, rng=limits.EXAMPLES, error=E.OptionValueError,
                     fix="pass --examples N (0 lists every over-tolerance identity)")
    if not np.isfinite(tolerance) or tolerance < 0:
        raise E.OptionValueError("tolerance must be a relative difference >= 0", values={"tolerance": tolerance},
                                 fix="pass e.g. --tolerance 0.1 for 10%")
    start = time.perf_counter()
    # the alias audit is about model names measuring one key, and --write rewrites files in their
    # stored layout: tables with the model's head axis (the loader reshapes some others)
    scope = Scope.of(paths, data_root=data_root, table=table, model_configs=model_configs, head_axis_only=True)
    registry = scope.registry()
    selection = scope.select()
    plan: dict[Path, Path] = {}
    if write is not None:
        plan = plan_destinations(selection.refs, Path(write), selection.catalog.root if selection.catalog else None,
                                 force=force)
        for folder in sorted({d.parent for d in plan.values()}):
            sweep(folder)  # temporary files of an earlier, killed run

    def run(loaded: Loaded) -> FileDedupe:
        audit = audit_table(loaded, tolerance=tolerance, prefer=prefer, examples=examples,
                            keep_for_write=write is not None)
        if write is not None and loaded.keyed is not None:
            audit.written = write_table(loaded, audit, plan[loaded.ref.path], registry, tolerance=tolerance)
        audit._kept_rows = audit._kept_names = None  # free the per-row state
        return audit

    by_path = load_many(selection, run, registry=registry, keep_arrow=write is not None, keep_validated=True,
                        workers=workers, on_progress=on_progress)
    files = [by_path[ref.path] for ref in selection.refs]
    return DedupeReport(files, tolerance, str(Path(write).expanduser().resolve()) if write is not None else None,
                        time.perf_counter() - start, selection.problems)


__all__ = ["DEFAULT_TOLERANCE", "AliasGroup", "DedupeReport", "FileDedupe", "OverTolerance", "Spread",
           "audit_table", "dedupe", "deduplicated_table", "destination", "plan_destinations", "write_table"]
