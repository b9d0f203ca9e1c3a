"""A table as its family declares it, and the declared guards that check its conventions.

:func:`as_declared` turns a table as stored into the layout the family keys (before any other
guard runs): stored names to declared names, phases stored side by side into one row per
phase, the latency column and unit to ``latency`` in milliseconds, derived columns computed,
and the table's place checked against its family's versioning. :func:`check_declared` runs the
guards a table declares (``TableSpec.guards``) on the typed columns and reports every failure
through the validator's collector. Nothing here knows a family by name: every decision is a
declaration in ``modperf/families/``; the evidence behind each is in docs/families.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..base import errors as E
from ..specs.models import ModelRegistry
from ..specs.roofline import GpuSpec, gpu_spec
from .catalog import LIBRARY_FAMILY_DIR, RELEASE_COLUMN, TableRef, releases_of, single_release
from .codes import combine, factorize, from_numpy, to_numpy
from .families.base import (
    LATENCY,
    NATIVE_VALUE,
    UNIT_DIVISOR,
    ArchitectureFields,
    Ceiling,
    ConfigHeads,
    DuplicateSpread,
    Family,
    LatencyFloor,
    RowRule,
    Scaling,
    ShardedKey,
    TableSpec,
)
from .reader import is_string_type

#: The validator's collector: add(error class, message, rows=..., values=..., fix=...).
Report = Callable[..., None]

__all__ = ["Typed", "as_declared", "check_declared", "system_of"]


def system_of(ref: TableRef) -> GpuSpec | None:
    """The spec of the file's system, or None where the file is outside the layout or the
    system has no spec file (physics-based guards and system-derived columns need one)."""
    if ref.system is None:
        return None
    spec = gpu_spec(ref.system)
    return spec if spec.from_file else None


def _strings(column: pa.ChunkedArray) -> np.ndarray:
    """A string column (plain or dictionary) as an object array, decoded per distinct value."""
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    if column.num_chunks != 1:
        column = pa.chunked_array([pa.concat_arrays([c.cast(c.type.value_type) for c in column.chunks])])
        column = column.dictionary_encode()
    chunk = column.chunk(0) if column.num_chunks else None
    if chunk is None:
        return np.zeros(0, dtype=object)
    return np.asarray(chunk.dictionary.to_pylist(), dtype=object)[to_numpy(chunk.indices)]


def _numpy(column: pa.ChunkedArray) -> np.ndarray:
    return _strings(column) if is_string_type(column.type) else to_numpy(column)


# --- the table as declared ------------------------------------------------------------------


def as_declared(table: pa.Table, spec: TableSpec, ref: TableRef
                ) -> tuple[pa.Table, np.ndarray | None, list[E.ModperfError]]:
    """(table in the declared layout, stored row of each loaded row or None when they are the
    same, failures). A MissingColumnError or SystemSpecError means the layout cannot be built;
    a MisplacedTableError does not stop the other guards."""
    failures: list[E.ModperfError] = []
    path = ref.path
    names = table.column_names
    renames = {old: new for old, new in spec.renames.items() if old in names and new not in names}
    if spec.latency.column != LATENCY and spec.latency.column in names and LATENCY not in names:
        renames[spec.latency.column] = LATENCY
    if renames:
        table = table.rename_columns([renames.get(c, c) for c in names])

    row_map: np.ndarray | None = None
    if spec.unpivot is not None:
        missing = [c for c in spec.unpivot.sources if c not in table.column_names]
        for col in missing:
            failures.append(E.MissingColumnError(
                f"missing column {col!r} (the table stores {', '.join(spec.unpivot.phases)} side by side)",
                file=path, values={"table": ref.table, "column": col},
                fix=f"re-collect {ref.table} with every phase's columns"))
        if missing:
            return table, None, failures
        table, row_map = _unpivot(table, spec)

    divisor = UNIT_DIVISOR[spec.latency.unit]
    if divisor != 1.0 and LATENCY in table.column_names and pa.types.is_floating(table.column(LATENCY).type):
        i = table.column_names.index(LATENCY)
        # the divisor as an arrow scalar taken from an array: a Python float would be converted
        # by pa.scalar, which probes for pandas (imports it: 0.2 s of CPU, see _repeated)
        scalar = from_numpy(np.array([divisor], dtype=np.float64))[0]
        table = table.set_column(i, LATENCY, pc.divide(table.column(LATENCY), scalar))

    for derived in spec.derived:
        missing = [c for c in derived.sources if c not in table.column_names]
        if missing:
            failures.extend(E.MissingColumnError(
                f"missing column {col!r} ({derived.name} = {derived.formula})", file=path,
                values={"table": ref.table, "column": col},
                fix=f"re-collect {ref.table} with {col!r}") for col in missing)
            continue
        system = gpu_spec(ref.system) if ref.system is not None else None
        if derived.needs_system and (system is None or not system.from_file):
            failures.append(E.SystemSpecError(
                f"{derived.name} = {derived.formula} needs the system's node spec, which is unknown for this file",
                file=path, values={"system": ref.system, "column": derived.name},
                fix="keep the file in the {system}/{family}/{backend}/{version}/ layout of a system with a "
                    "systems/{system}.yaml (or record the column in the table)"))
            continue
        assert system is not None or not derived.needs_system
        columns = {c: _numpy(table.column(c)) for c in derived.sources}
        values = np.asarray(derived.compute(columns, system or gpu_spec(None)))
        array = from_numpy(values.astype(np.int64) if values.dtype.kind in "iub" else values.astype(np.float64))
        if derived.name in table.column_names:
            table = table.set_column(table.column_names.index(derived.name), derived.name, array)
        else:
            table = table.append_column(derived.name, array)
    if any(isinstance(f, (E.MissingColumnError, E.SystemSpecError)) for f in failures):
        return table, row_map, failures

    if spec.library is not None and ref.backend is not None and ref.backend != spec.library:
        # a library table in a framework folder is read as the one release its rows record (the
        # catalog serves it in that release's slot, check warns); with none or several, no
        # slot can serve it
        recorded = (ref.misplaced.recorded if ref.misplaced is not None else
                    releases_of(table.column(RELEASE_COLUMN).to_pylist()) if RELEASE_COLUMN in table.column_names
                    else ())
        if single_release(recorded) is None:
            what = f"several releases ({', '.join(recorded)})" if len(recorded) > 1 else "no release"
            failures.append(E.MisplacedUnservedError(
                f"{ref.table} tables are versioned by the {spec.library} release (folder "
                f"{{system}}/{LIBRARY_FAMILY_DIR}/{spec.library}/{{release}}/); this one sits in the {ref.backend} "
                f"framework folder and its rows record {what}: no release's slot can serve it",
                file=path, values={"folder": f"{ref.backend}/{ref.version}", "recorded_versions": list(recorded)},
                fix=f"split it by release into {ref.system}/{LIBRARY_FAMILY_DIR}/{spec.library}/<release>/ (each "
                    "part's rows recording that release in their version column), or delete it"))
    return table, row_map, failures


def _repeated(text: str, n: int) -> pa.Array:
    """A string array of ``n`` copies of ``text``, built from its buffers: ``pa.array`` and
    ``pa.scalar`` probe for pandas, which imports it (0.2 s of CPU in every process that
    unpivots a table, each worker of a forked check included)."""
    data = text.encode()
    if n * len(data) >= 2**31:  # past 32-bit offsets
        return pa.array([text] * n, pa.string())
    offsets = np.arange(n + 1, dtype=np.int32)
    offsets *= len(data)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data * n)])


def _unpivot(table: pa.Table, spec: TableSpec) -> tuple[pa.Table, np.ndarray]:
    assert spec.unpivot is not None
    sources = set(spec.unpivot.sources)
    kept = [c for c in table.column_names if c not in sources]
    parts = []
    for phase, columns in spec.unpivot.phases.items():
        part = table.select(kept)
        part = part.append_column(spec.unpivot.key, _repeated(phase, table.num_rows))
        for name, summed in columns.items():
            value = table.column(summed[0])
            for other in summed[1:]:
                value = pc.add(value, table.column(other))
            part = part.append_column(name, value)
        parts.append(part)
    unpivoted = pa.concat_tables(parts)
    return unpivoted, np.tile(np.arange(table.num_rows, dtype=np.int64), len(parts))


# --- the guards -------------------------------------------------------------------------------


@dataclass
class Typed:
    """The validated table's typed columns, with the arrow table for everything else."""

    table: pa.Table
    categorical: Mapping[str, Any]  # name -> object with codes and values
    integers: Mapping[str, np.ndarray]
    latency: np.ndarray  # ms
    key_columns: tuple[str, ...]  # present key columns, in the family's order

    def decoded(self, name: str) -> np.ndarray:
        if name in self.integers:
            return self.integers[name]
        c = self.categorical.get(name)
        if c is not None:
            return np.asarray(c.values, dtype=object)[c.codes]
        return _numpy(self.table.column(name))

    def coded(self, name: str) -> Any:
        """String columns keep their codes (for per-value rates), numbers are arrays."""
        if name in self.categorical:
            return self.categorical[name]
        return self.decoded(name)

    def codes(self, name: str) -> tuple[np.ndarray, int]:
        c = self.categorical.get(name)
        if c is not None:
            return c.codes.astype(np.int64), max(len(c.values), 1)
        _, inv = factorize(self.integers[name])
        return inv, int(inv.max()) + 1 if inv.size else 1

    def has(self, name: str) -> bool:
        return name in self.integers or name in self.categorical or name in self.table.column_names


class _Columns(Mapping[str, Any]):
    def __init__(self, typed: Typed, coded: bool) -> None:
        self.typed, self.coded = typed, coded

    def __getitem__(self, name: str) -> Any:
        if not self.typed.has(name):
            raise KeyError(name)
        return self.typed.coded(name) if self.coded else self.typed.decoded(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.typed.table.column_names)

    def __len__(self) -> int:
        return self.typed.table.num_columns


def check_declared(add: Report, typed: Typed, spec: TableSpec, family: Family, ref: TableRef,
                   registry: ModelRegistry) -> None:
    """Run every row guard the table declares; each failure goes to ``add``. Guards about the
    stored points as a whole (scaling along a key, duplicate agreement, the sharded-key
    fingerprint) run on the keyed table (:mod:`modperf.data.keyed_guards`)."""
    for guard in spec.guards:
        if isinstance(guard, RowRule):
            _row_rule(add, typed, guard, ref)
        elif isinstance(guard, ShardedKey):
            _sharded_key_divides(add, typed, guard)
        elif isinstance(guard, DuplicateSpread) and guard.within is not None:
            _duplicates_within(add, typed, guard)
        elif isinstance(guard, (Scaling, DuplicateSpread)):
            continue
        elif isinstance(guard, Ceiling):
            _ceiling(add, typed, family, ref, guard)
        elif isinstance(guard, LatencyFloor):
            _latency_floor(add, typed, spec, guard)
        elif isinstance(guard, ConfigHeads):
            _config_heads(add, typed, guard, registry)
        elif isinstance(guard, ArchitectureFields):
            _architecture_fields(add, typed, guard, registry)
        else:  # pragma: no cover  (a new guard type without a runner is a bug)
            raise TypeError(f"no runner for guard {guard!r}")


def _examples(typed: Typed, rows: np.ndarray, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{c: typed.decoded(c)[r] for c in columns} for r in rows[:3]]


def _row_rule(add: Report, typed: Typed, rule: RowRule, ref: TableRef) -> None:
    if not all(typed.has(c) for c in rule.columns):
        return  # the rule's optional columns are absent
    cols = {c: typed.decoded(c) for c in rule.columns}
    bad = ~np.broadcast_to(np.asarray(rule.holds(cols, system_of(ref)), dtype=bool), typed.latency.shape)
    if bad.any():
        rows = np.flatnonzero(bad)
        add(E.InvariantError, f"{rule.name} fails ({rule.why})", rows=rows,
            values={"examples": _examples(typed, rows, rule.columns)}, fix=rule.fix)


def _group_codes(typed: Typed, columns: tuple[str, ...], n: int) -> np.ndarray:
    codes, cards = [], []
    for name in columns:
        c, card = typed.codes(name)
        codes.append(c)
        cards.append(card)
    return combine(codes, cards, n) if codes else np.zeros(n, dtype=np.int64)


def _sharded_key_divides(add: Report, typed: Typed, guard: ShardedKey) -> None:
    if guard.column not in typed.integers or guard.by not in typed.integers:
        return
    value, by = typed.integers[guard.column], typed.integers[guard.by]
    bad = (by <= 0) | (value % np.maximum(by, 1) != 0)
    if bad.any():
        rows = np.flatnonzero(bad)
        add(E.InvariantError, f"{guard.column} is not divisible by {guard.by}: no rank can run an equal share",
            rows=rows, values={"examples": _examples(typed, rows, (guard.column, guard.by))}, fix=guard.fix)


def _duplicates_within(add: Report, typed: Typed, guard: DuplicateSpread) -> None:
    assert guard.within is not None
    if not typed.has(guard.within):
        return
    n = typed.latency.size
    if not n:
        return
    within = np.unique(typed.decoded(guard.within), return_inverse=True)[1].reshape(-1).astype(np.int64)
    _, group = factorize(_group_codes(typed, typed.key_columns, n))
    key = combine([group, within], [int(group.max()) + 1, int(within.max()) + 1], n)
    order = np.lexsort((typed.latency, key))
    k, lat = key[order], typed.latency[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]]) if n else np.zeros(0, np.int64)
    sizes = np.diff(np.append(starts, n))
    dup = np.flatnonzero(sizes > 1)
    lo, hi = lat[starts[dup]], lat[starts[dup] + sizes[dup] - 1]
    usable = lo > 0
    if int(usable.sum()) < guard.min_keys:
        return
    spread = hi[usable] / lo[usable] - 1.0
    median = float(np.median(spread))
    if median > guard.limit:
        rows = np.sort(order[starts[dup][usable]])
        add(E.DuplicateSpreadError,
            f"rows of one {guard.within} sharing a full key disagree: the median spread (max / min - 1) over "
            f"{spread.size} duplicated keys is {median:.3g} (re-measurements agree within {guard.limit:g}); such rows "
            "stand for different work",
            rows=rows, values={"duplicated_keys": int(spread.size), "median_spread": round(median, 4)}, fix=guard.fix)


def _ceiling(add: Report, typed: Typed, family: Family, ref: TableRef, guard: Ceiling) -> None:
    gpu = system_of(ref)
    if gpu is None or family.roof is None:
        return
    roof = family.roof(ref.table, _Columns(typed, coded=True), gpu)
    bound = np.broadcast_to(np.asarray(getattr(roof, guard.component), dtype=np.float64), typed.latency.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        utilisation = bound / (typed.latency * 1e-3)
    usable = np.isfinite(typed.latency) & (typed.latency > 0)
    if guard.where is not None:
        usable &= np.asarray(guard.where(_Columns(typed, coded=False)), dtype=bool)
    bad = usable & (utilisation > guard.limit)
    if bad.any():
        rows = np.flatnonzero(bad)
        worst = rows[np.argsort(-utilisation[rows])[:3]]
        add(E.BeyondRooflineError,
            f"rows beat their roofline by more than {guard.limit:g}x ({guard.rate}"
            + (f"; {guard.where_text}" if guard.where_text else "")
            + f", system {ref.system}): the work their key declares cannot run this fast",
            rows=rows, values={"max_utilisation": round(float(utilisation[rows].max()), 3),
                               "worst": [{**{c: typed.decoded(c)[r] for c in typed.key_columns},
                                          "latency_ms": float(typed.latency[r]),
                                          "utilisation": round(float(utilisation[r]), 3)} for r in worst]},
            fix=guard.fix)


def _latency_floor(add: Report, typed: Typed, spec: TableSpec, guard: LatencyFloor) -> None:
    lat = typed.latency
    bad = (lat > 0) & (lat < guard.ms)
    if bad.any():
        rows = np.flatnonzero(bad)
        add(E.UnitsError,
            f"latencies below {guard.ms:g} ms, after converting the declared unit ({spec.latency.unit}) of column "
            f"{spec.latency.column!r} to ms: no measured call is that fast",
            rows=rows, values={"examples_ms": lat[rows[:3]].tolist(), "declared_unit": spec.latency.unit},
            fix=guard.fix)


def _config_heads(add: Report, typed: Typed, guard: ConfigHeads, registry: ModelRegistry) -> None:
    if not typed.has(guard.model_column) or not all(typed.has(c) for c, _ in guard.fields):
        return
    models = typed.decoded(guard.model_column)
    for name in sorted(set(models.tolist())):
        if str(name) not in registry:
            continue  # provenance only: a model without a config is not checked
        cfg = registry.get(str(name))
        rows_of = models == name
        try:
            natives = [(col, field, cfg.get(field)) for col, field in guard.fields]
        except E.ModelConfigError as exc:
            add(E.ModelConfigError, f"{exc.detail} (the {guard.model_column} column names it)",
                rows=np.flatnonzero(rows_of), values={"model": name}, fix=exc.fix)
            continue
        bad = np.zeros(rows_of.size, dtype=bool)
        tp: np.ndarray | None = None
        for col, _, native in natives:
            local = typed.decoded(col)
            if guard.stored == NATIVE_VALUE:
                bad |= rows_of & (local != native)
                continue
            safe = np.maximum(local, 1)
            bad |= rows_of & ((local <= 0) | (native % safe != 0))
            share = native // safe
            bad |= rows_of & (tp is not None) & (share != (tp if tp is not None else share))
            tp = share if tp is None else tp
        if bad.any():
            rows = np.flatnonzero(bad)
            cls = E.NativeContractError if guard.stored == NATIVE_VALUE else E.RankLocalError
            what = ("must equal the config's value on every row" if guard.stored == NATIVE_VALUE else
                    "must be the config's value divided by one integer tp (the same tp for every column)")
            add(cls, f"{', '.join(c for c, _ in guard.fields)} of {name} {what}", rows=rows,
                values={"model": name, "config": {f: v for _, f, v in natives},
                        "examples": _examples(typed, rows, tuple(c for c, _ in guard.fields))},
                fix=guard.fix)


def _architecture_fields(add: Report, typed: Typed, guard: ArchitectureFields, registry: ModelRegistry) -> None:
    if not typed.has(guard.architecture_column):
        return
    arch = typed.decoded(guard.architecture_column)
    known: dict[str, set[tuple[Any, ...]]] = {}
    for model_id in registry.ids():
        try:
            cfg = registry.get(model_id)
            values = tuple(cfg.get(f, None) for _, f in guard.fields)
        except E.ModelError:
            continue
        for a in cfg.architectures:
            known.setdefault(a, set()).add(values)
    columns = tuple(c for c, _ in guard.fields)
    stored = [typed.decoded(c) for c in columns]
    bad = np.zeros(arch.size, dtype=bool)
    combos: dict[tuple[Any, ...], list[int]] = {}
    for i, row in enumerate(zip(arch.tolist(), *[s.tolist() for s in stored])):
        combos.setdefault(row, []).append(i)
    for combo, members in combos.items():
        if tuple(combo[1:]) not in known.get(combo[0], set()):
            bad[members] = True
    if bad.any():
        rows = np.flatnonzero(bad)
        add(E.InvariantError,
            f"{', '.join(columns)} match no model config of the row's {guard.architecture_column}",
            rows=rows, values={"examples": _examples(typed, rows, (guard.architecture_column, *columns))},
            fix=guard.fix)
