"""The guards: read one table, check it against its family's declaration, collect every failure.

Nothing here repairs data. A table either passes every guard and comes out as a
:class:`ValidatedTable` (typed numpy columns plus each row's native head count), or the caller
gets the complete list of failures, each a typed error naming file, rows, values and fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..base import errors as E
from ..base import limits
from ..specs.models import ModelConfig, ModelRegistry
from .catalog import TableRef
from .codes import combine, dense_ranks, factorize, narrowest_signed, to_numpy, unique_codes
from .conventions import Typed, as_declared, check_declared
from .families.base import (
    ARCHITECTURE,
    EXTRA_MEASUREMENTS,
    HEADS,
    LATENCY,
    MODEL,
    PROVENANCE_COLUMNS,
    TP,
    UNIT_DIVISOR,
    Family,
    TableSpec,
    Tier,
)
from .reader import is_csv, is_string_type, read_footer, read_narrow_columns, read_table, stored_type

#: Heads columns: a fractional value here is its own error kind.
HEAD_COLUMNS = (HEADS, "num_key_value_heads", "local_num_heads")
def legacy_migrate_fix(path: Path, has_model_column: bool) -> str:
    """The command that migrates a legacy table (no num_heads; docs/migration.md): the native
    comes from the table's model column, else from ``--model`` (required, no default); a CSV
    table is written as parquet beside it, a parquet one needs ``--out`` (never replaced)."""
    out = "" if is_csv(path) else f" --out {path.parent / 'migrated'}"
    if has_model_column:
        return f"run `modperf migrate {path}{out}` (a dry run: it prints the plan; add --execute to write)"
    return (f"run `modperf migrate {path} --model MODEL_ID{out}` (a dry run: it prints the plan; add --execute to "
            "write), MODEL_ID being the model the table was collected for (no default; the MLA kernel tables: "
            "deepseek-ai/DeepSeek-V3)")


@dataclass
class Categorical:
    codes: np.ndarray  # one per row: int32, or the narrowest signed type where read row group by row group
    values: list[str]  # code -> value


@dataclass
class ValidatedTable:
    """A table that passed every guard, as typed columns."""

    ref: TableRef
    family: Family
    spec: TableSpec
    n_rows: int
    categorical: dict[str, Categorical]
    #: Integer columns (keys, tp_size): int64, or the narrowest integer type (signed or unsigned)
    #: that holds the column where the file was read row group by row group
    #: (:func:`read_narrow`); arithmetic widens first.
    integers: dict[str, np.ndarray]
    latency: np.ndarray  # float64
    model: Categorical | None
    #: The row's native head count (None where the table cannot tell: local tier without tp);
    #: narrow where it comes from the model configs.
    native: np.ndarray | None
    configs: dict[str, ModelConfig] = field(default_factory=dict)
    geometry: dict[str, tuple[tuple[str, Any], ...]] = field(default_factory=dict)
    missing_optional: tuple[str, ...] = ()
    #: Distinct values of the ``version`` column (provenance).
    recorded_versions: tuple[str, ...] = ()
    #: Rows in the file as stored (n_rows counts one row per phase where the layout unpivots).
    stored_rows: int = -1

    def __post_init__(self) -> None:
        if self.stored_rows < 0:
            self.stored_rows = self.n_rows

    def present(self, names: Iterable[str]) -> tuple[str, ...]:
        return tuple(n for n in names if n in self.categorical or n in self.integers)


def _encode(column: pa.ChunkedArray) -> Categorical:
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    if column.num_chunks == 1:
        chunk = column.chunk(0)
        return Categorical(to_numpy(chunk.indices).astype(np.int32, copy=False),
                           [str(v) for v in chunk.dictionary.to_pylist()])
    # chunks may carry different dictionaries: unify them, then concatenate the indices
    unified = pa.Table.from_arrays([column], names=["c"]).unify_dictionaries().column("c")
    codes = np.concatenate([to_numpy(c.indices) for c in unified.chunks]) \
        if unified.num_chunks else np.zeros(0, dtype=np.int32)
    values = unified.chunk(0).dictionary.to_pylist() if unified.num_chunks else []
    return Categorical(codes.astype(np.int32, copy=False), [str(v) for v in values])


def _wide(values: np.ndarray) -> np.ndarray:
    """Integers as int64 for arithmetic (no copy where they already are)."""
    return values.astype(np.int64, copy=False)


def _product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a * b`` row by row, exact, in the narrowest signed type that holds every product (a
    20M-row table's heads x tp in int16 is 40 MB, in int64 160): the bound is taken in Python
    integers; past int64 the product wraps as int64 arithmetic does (the guards check the
    ranges of heads and tp before they multiply them)."""
    return np.multiply(a, b, dtype=_product_type(a, b))


def _product_type(a: np.ndarray, b: np.ndarray) -> np.dtype:
    """The type :func:`_product` computes ``a * b`` in."""
    if not a.size:
        return np.dtype(np.int64)
    bound = max(abs(int(a.min())), abs(int(a.max()))) * max(abs(int(b.min())), abs(int(b.max())))
    return narrowest_signed(-bound, bound)


#: Row-wise checks over this many rows at a time (bounded temporaries on a big table).
_CHUNK = 1 << 20


def _not_rank_local(known: np.ndarray, stale: np.ndarray, heads: np.ndarray, tp: np.ndarray,
                    native: np.ndarray) -> np.ndarray:
    """``known & ~stale & (tp > 1) & (heads * tp != native)``, a chunk of rows at a time: on a
    20M-row table the whole expression's temporaries were validation's peak."""
    dtype = _product_type(heads, tp)
    bad = np.empty(known.size, dtype=bool)
    for lo in range(0, known.size, _CHUNK):
        part = slice(lo, lo + _CHUNK)
        out = bad[part]
        np.greater(tp[part], 1, out=out)
        out &= known[part]
        out &= ~stale[part]
        out &= np.multiply(heads[part], tp[part], dtype=dtype) != native[part]
    return bad


@dataclass
class NarrowRead:
    """A table's typed columns, read row group by row group into preallocated narrow arrays."""

    rows: int
    names: set[str]  # every column, by its declared name
    categorical: dict[str, Categorical]
    integers: dict[str, np.ndarray]
    latency: np.ndarray


def _narrow_wanted(spec: TableSpec, ref: TableRef) -> bool:
    """Whether a table can be validated from its typed columns alone: a parquet file whose
    declared layout only renames columns, and that declares no guards (they read any column)."""
    return (not is_csv(ref.path) and spec.unpivot is None and not spec.derived and not spec.guards
            and (spec.library is None or ref.backend is None or ref.backend == spec.library)
            and UNIT_DIVISOR[spec.latency.unit] == 1.0)


#: A table of at least this many rows is read row group by row group into narrow arrays
#: (:func:`read_narrow`); a smaller one is read whole (its decoded table is small, and one read
#: of every column costs the fewest calls).
NARROW_ROWS = 1 << 16


def read_narrow(ref: TableRef, family: Family, meta: pq.FileMetaData | None = None) -> NarrowRead | None:
    """The columns validation types, read one row group at a time into preallocated arrays:
    integers in the narrowest integer type that holds them (the footer's statistics choose it, a
    row group outside them widens it), strings as codes in the narrowest type over one
    dictionary (each row group's dictionary values in order of first appearance, the order
    arrow's dictionary unification gives, so the codes and values are the whole read's),
    latency as float64. Every column is decoded (a damaged one fails as in a whole read).

    None wherever the whole read must decide: the file fails to read, the layout is not only
    renames, a column is missing, of another type or holds nulls, or the table is empty. The
    caller then reads it whole, which reports what is wrong exactly as before."""
    spec = family.spec(ref.table)
    if not _narrow_wanted(spec, ref):
        return None
    if meta is None:
        try:
            meta = read_footer(ref.path)
        except E.UnreadableTableError:
            return None
    if meta.num_rows == 0:
        return None
    schema = meta.schema.to_arrow_schema()
    declared_names = schema.names
    if spec.renames or spec.latency.column != LATENCY:
        from .conventions import as_declared  # (only renames: the layout reads nothing else)

        declared, row_map, failures = as_declared(schema.empty_table(), spec, ref)
        if failures or row_map is not None:
            return None
        declared_names = declared.column_names
    stored = dict(zip(declared_names, schema.names))  # declared name -> stored name
    names = set(stored)
    required = [c for c in spec.key_columns if c not in spec.optional] + [LATENCY]
    required += [TP] if family.requires_tp else []
    required += [MODEL] if family.requires_model else []
    if any(c not in names for c in required):
        return None
    strings = list(dict.fromkeys(c for c in (*spec.categorical, MODEL, ARCHITECTURE, "version") if c in names))
    ints = list(dict.fromkeys(c for c in (*spec.integer_keys, TP) if c in names))
    types = {c: schema.field(stored[c]).type for c in names}
    if not (all(is_string_type(types[c]) for c in strings) and pa.types.is_floating(types[LATENCY])
            and all(pa.types.is_integer(types[c]) and types[c] != pa.uint64() for c in ints)):
        return None

    columns = read_narrow_columns(ref.path, meta, {c: stored[c] for c in strings},
                                  {c: stored[c] for c in ints}, stored[LATENCY])
    if columns is None:
        return None
    if columns.rows >= RELEASE_ROWS:  # the row groups' decoded memory back to the system (arrow's pool keeps it)
        pa.default_memory_pool().release_unused()
    return NarrowRead(
        columns.rows, names,
        {c: Categorical(codes, values) for c, (codes, values) in columns.strings.items()},
        columns.integers, columns.floats[stored[LATENCY]])


def _rows(mask: np.ndarray) -> np.ndarray:
    return np.flatnonzero(mask)


class _Collector:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.failures: list[E.ModperfError] = []
        #: Stored row of each loaded row, where the declared layout reshapes rows (unpivot).
        self.row_map: np.ndarray | None = None

    def add(self, cls: type[E.ModperfError], message: str, *, rows: np.ndarray | None = None,
            values: dict[str, Any] | None = None, fix: str | None = None) -> None:
        kwargs: dict[str, Any] = {"file": self.path, "values": values, "fix": fix}
        if rows is not None and self.row_map is not None:
            rows = np.unique(self.row_map[rows])  # rows as the file stores them
        if rows is not None:
            kwargs["rows"] = rows[: E.ROWS_SHOWN].tolist()
            kwargs["row_count"] = int(rows.size)
        self.failures.append(cls(message, **kwargs))


#: A table of at least this many rows, read by validate_table, hands its decoded memory back to
#: the system once typed (a smaller one's is reused by the next table's read).
RELEASE_ROWS = 1 << 20


def validate_table(
    ref: TableRef, family: Family, registry: ModelRegistry, table: pa.Table | None = None
) -> tuple[ValidatedTable | None, list[E.ModperfError]]:
    """Run every guard on one table. Returns (validated, []) or (None, failures)."""
    path = ref.path
    spec = family.spec(ref.table)
    out = _Collector(path)
    read_here = table is None
    # a table whose guards read only its typed columns is read row group by row group into
    # them (on a 20M-row table the decoded Arrow table, GiBs, never lives whole); anything that
    # read leaves to the whole read (a failure, a null, a type) is read whole, as before
    narrow, meta = None, None
    if table is None and _narrow_wanted(spec, ref):
        try:
            meta = read_footer(path)
        except E.ModperfError:
            meta = None  # read_table says why, as before
        if meta is not None and meta.num_rows >= NARROW_ROWS:
            narrow = read_narrow(ref, family, meta)
    if narrow is None and table is None:
        try:
            table = read_table(path, meta=meta)
        except E.UnreadableTableError as exc:
            return None, [exc]
    if narrow is not None:
        stored_rows = narrow.rows
        names = narrow.names
    else:
        assert table is not None
        # the family's declared layout: names, phases, latency unit, derived columns, placement
        stored_rows = table.num_rows
        table, out.row_map, shape_failures = as_declared(table, spec, ref)
        out.failures.extend(shape_failures)
        if any(isinstance(f, (E.MissingColumnError, E.SystemSpecError)) for f in shape_failures):
            return None, out.failures
        names = set(table.column_names)

    # -- columns present -------------------------------------------------------------------
    required = [c for c in spec.key_columns if c not in spec.optional] + [LATENCY]
    if family.requires_tp:
        required.append(TP)
    if family.requires_model:
        required.append(MODEL)
    for col in required:
        if col in names:
            continue
        if col == HEADS:
            fix = legacy_migrate_fix(path, MODEL in names)
            msg = "no num_heads column: legacy layout whose head axis is unknown (nothing is backfilled)"
        elif col == TP:
            fix = "tp_size is mandatory in module tables: re-collect with a collector that records it"
            msg = "no tp_size column"
        elif col == MODEL:
            fix = (f"add a `model` column with each row's HF model id (`modperf migrate {path} --model "
                   "MODEL_ID` writes it for single-model legacy tables)")
            msg = "no model column: the native head count cannot be derived"
        else:
            fix = f"re-collect {ref.table} with its key column {col!r}, or migrate the file"
            msg = f"missing key column {col!r}"
        out.add(E.MissingColumnError, msg, values={"table": ref.table, "column": col}, fix=fix)
    known = set(spec.key_columns) | {LATENCY, TP, *PROVENANCE_COLUMNS, *EXTRA_MEASUREMENTS, *spec.carried,
                                     *(d.name for d in spec.derived)}
    for col in sorted(names - known):
        out.add(
            E.UnexpectedColumnError,
            f"column {col!r} is not declared for table {ref.table} (family {family.name}); it may key rows "
            "that would otherwise be merged",
            values={"column": col},
            fix=f"declare {col!r} in modperf/families/{family.name}.py if it is a key, or drop it from the file",
        )
    if out.failures and any(isinstance(f, E.MissingColumnError) for f in out.failures):
        return None, out.failures

    latency: np.ndarray | None
    if narrow is not None:  # every column is of its type, without nulls (else it was read whole)
        n = narrow.rows
        categorical, integers, latency = narrow.categorical, narrow.integers, narrow.latency
    else:
        assert table is not None
        n = table.num_rows
        categorical, integers, latency = _typed_columns(out, table, spec, names)
    missing_optional = tuple(c for c in spec.optional if c not in names)
    # Type and null failures leave columns that cannot be read as numbers: stop here (every
    # such failure is already collected). An unexpected column alone does not stop the checks.
    if any(isinstance(f, (E.ColumnTypeError, E.NonIntegerHeadsError, E.NullValueError)) for f in out.failures):
        return None, out.failures
    assert latency is not None
    if not spec.guards and table is not None:
        # nothing below reads the arrow table but the declared guards: a table read here goes
        # now (its columns are typed), a big one's memory back to the system (arrow's allocator
        # keeps it otherwise, where numpy's arrays cannot reuse it: a GiB on a 20M-row table)
        del table
        if read_here and n >= RELEASE_ROWS:
            pa.default_memory_pool().release_unused()

    # -- value ranges (modperf.base.limits; docs/limits.md) ---------------------------------------
    if n == 0:
        out.add(E.EmptyTableError, "the table holds no rows: it can answer nothing",
                fix="re-collect the table, or remove the file")
        return None, out.failures
    for col, values in integers.items():
        # checked once here, so that nothing downstream multiplies numbers that wrap in int64
        # (num_heads = 2**62 + 32 at tp 4 is 128 modulo 2**64)
        rng = limits.range_of(col)
        if rng.low <= int(values.min()) and int(values.max()) <= rng.high:
            continue
        values = _wide(values)
        bad = _rows((values < rng.low) | (values > rng.high))
        counts = col in (HEADS, TP, "local_num_heads")
        out.add(E.InvalidHeadsError if counts else E.ValueRangeError,
                f"{col!r} must be an integer in {rng.describe()} ({rng.what})", rows=bad,
                values={"column": col, "examples": values[bad[:3]].tolist()},
                fix=f"re-collect these rows; a {col} of zero or less never ran" if counts
                and (values[bad] <= 0).all() else f"re-collect these rows; {col} outside {rng.describe()} is not "
                "a measurement")
    ranges_ok = not any(isinstance(f, (E.InvalidHeadsError, E.ValueRangeError)) for f in out.failures)

    model = categorical.pop(MODEL, None)
    architecture = categorical.pop(ARCHITECTURE, None)
    version = categorical.pop("version", None)
    configs: dict[str, ModelConfig] = {}
    row_config_ok = np.ones(n, dtype=bool)
    if model is not None:
        used = np.zeros(len(model.values), dtype=bool)  # (a bincount widens every code to int64 first)
        used[unique_codes(model.codes, len(model.values))] = True
        for code, name in enumerate(model.values):
            if not used[code]:
                continue
            try:
                cfg = registry.get(name)
                cfg.native_heads  # noqa: B018  (validates the field)
                configs[name] = cfg
            except E.ModelError as exc:
                rows = _rows(model.codes == code)
                row_config_ok[rows] = False
                out.add(type(exc), exc.detail, rows=rows, values={"model": name, **exc.values}, fix=exc.fix)
    geometry: dict[str, tuple[tuple[str, Any], ...]] = {}
    if model is not None and family.tier is not Tier.LOCAL:
        fields = family.geometry_for(ref.table)
        for name, cfg in configs.items():
            try:
                geometry[name] = cfg.geometry(fields)
            except E.ModelError as exc:
                rows = _rows(model.codes == model.values.index(name))
                row_config_ok[rows] = False
                out.add(type(exc), f"{exc.detail} (the {family.title} reads it)", rows=rows,
                        values={"model": name}, fix=exc.fix)

    # per-row native head count, by the family's rule
    native: np.ndarray | None = None
    if model is not None and configs:
        natives = [configs[m].native_heads if m in configs else -1 for m in model.values]
        by_code = np.array(natives, dtype=narrowest_signed(min(natives), max(natives)))
        native = by_code[model.codes]  # narrow: 20M rows hold 20-40 MB, not 160
    elif TP in integers and family.tier is Tier.LOCAL and (integers[TP] > 1).any():
        # A file of tp chains records the native as num_heads * tp_size. A file of tp=1 sweeps
        # alone does not record it (every local count is a grid point), so none is derived.
        native = _product(integers[HEADS], integers[TP])

    if architecture is not None and model is not None:
        width = len(architecture.values)
        # (model, architecture) pairs in the narrowest type over their count, combined in place
        pair = model.codes.astype(narrowest_signed(0, len(model.values) * width))
        pair *= width
        pair += architecture.codes
        pairs = unique_codes(pair)
        del pair
        for m_code, a_code in zip(pairs // width, pairs % width):
            name, arch = model.values[m_code], architecture.values[a_code]
            config = configs.get(name)
            if config is not None and config.architectures and arch not in config.architectures:
                rows = _rows((model.codes == m_code) & (architecture.codes == a_code))
                out.add(E.ArchitectureMismatchError,
                        f"architecture {arch!r} does not match the config of {name}",
                        rows=rows, values={"model": name, "architecture": arch,
                                           "config_architectures": list(config.architectures)},
                        fix="correct the model column (the name may belong to another checkpoint) or the config")

    # -- latency values --------------------------------------------------------------------
    bad_latency = ~np.isfinite(latency)
    bad_latency |= latency < 0
    zero = latency == 0
    if zero.any() and spec.zero_latency_rule is not None:
        allowed = np.zeros(n, dtype=bool)
        ok_rows = zero & row_config_ok

        def per_row(field_name: str) -> np.ndarray:
            if model is None:
                raise KeyError(f"{ref.table} has no model column: its zero-latency rule cannot read {field_name!r}")
            values = np.array(
                [configs[m].get(field_name) if m in configs else -1 for m in model.values], dtype=np.int64
            )
            return values[model.codes]

        if ok_rows.any():
            allowed = spec.zero_latency_rule({k: _wide(v) for k, v in integers.items()}, per_row) & ok_rows
        zero &= ~allowed
        del allowed, ok_rows
    bad_latency |= zero
    del zero
    if bad_latency.any():
        rows = _rows(bad_latency)
        note = f"; this table allows 0 only where {spec.zero_latency_note}" if spec.zero_latency_note else ""
        out.add(E.InvalidLatencyError, f"latency must be finite and > 0 ms{note}", rows=rows,
                values={"examples": latency[rows[:3]].tolist()},
                fix="re-measure these rows; a failed or skipped measurement must not be stored as a latency")
    del bad_latency  # (a 20M-row table's row masks are 19 MiB each: none outlives its check)

    if not ranges_ok:  # the head-axis checks multiply heads by tp: not with numbers out of range
        return None, out.failures

    # -- head axis: stale fingerprint, rank-local, native contract -------------------------
    stale_rows = np.zeros(n, dtype=bool)
    if family.stale_guard and TP in integers and HEADS in integers:
        stale_rows = _stale_fingerprint(out, model, version, integers, path, n,
                                        lambda heads: _migrate_fix(path, heads, model is None, registry, family))
        if family.tier is Tier.LOCAL and not stale_rows.any():
            stale_rows = _stale_chains(out, spec, categorical, integers, path, n)
    if native is not None and HEADS in integers and TP in integers and model is not None:
        heads, tp = integers[HEADS], integers[TP]
        known_rows = row_config_ok & (native > 0)
        if family.tier is Tier.NATIVE:
            _native_contract(out, model, heads, tp, native, known_rows, integers.get("local_num_heads"))
        else:
            bad = _not_rank_local(known_rows, stale_rows, heads, tp, native)
            if bad.any():
                _report_by_model(
                    out, E.RankLocalError, bad, model, heads, tp, native,
                    "tp_size > 1 row is not rank-local: num_heads * tp_size != native",
                    "num_heads must be the heads one rank runs (native // tp_size); re-collect these rows, "
                    "or run `modperf migrate` if the file used the native convention throughout",
                )

    # -- collisions: equal native, different geometry ---------------------------------------
    if family.tier is not Tier.LOCAL and geometry:
        _collisions(out, family, ref.table, configs, geometry)

    # -- the conventions the table declares (per-rank vs global, units, ...) ----------------
    if spec.guards:
        typed = Typed(table, categorical, integers, latency,
                      tuple(c for c in spec.key_columns if c in categorical or c in integers))
        check_declared(out.add, typed, spec, family, ref, registry)

    if out.failures:
        return None, out.failures
    recorded = tuple(sorted(version.values[c] for c in unique_codes(version.codes))) if version is not None else ()
    return (
        ValidatedTable(ref, family, spec, n, categorical, integers, latency, model, native, configs,
                       geometry, missing_optional, recorded, stored_rows),
        [],
    )


def _typed_columns(out: _Collector, table: pa.Table, spec: TableSpec, names: set[str]
                   ) -> tuple[dict[str, Categorical], dict[str, np.ndarray], np.ndarray | None]:
    """The columns validation reads, typed (strings as codes, integers as int64, latency as
    float64); a column of another type or holding nulls is a failure, and left out."""
    categorical: dict[str, Categorical] = {}
    integers: dict[str, np.ndarray] = {}
    string_cols = [c for c in spec.categorical if c in names]
    int_cols = [c for c in (*spec.integer_keys, TP) if c in names]
    int_cols = list(dict.fromkeys(int_cols))
    provenance_strings = [c for c in (MODEL, ARCHITECTURE, "version") if c in names]
    latency = None
    for col in string_cols + provenance_strings:
        column = table.column(col)
        if not is_string_type(column.type):
            out.add(E.ColumnTypeError, f"column {col!r} is {stored_type(column.type)}, expected string",
                    values={"column": col}, fix=f"store {col!r} as a string column")
            continue
        if column.null_count:
            bad = _rows(np.asarray(to_numpy(column.is_null())))
            out.add(E.NullValueError, f"null {col!r}", rows=bad, values={"column": col},
                    fix=f"fill {col!r} on these rows from the collection log, or drop the rows")
            continue
        categorical[col] = _encode(column)
    for col in int_cols:
        column = table.column(col)
        t = column.type
        if column.null_count:
            bad = _rows(np.asarray(to_numpy(column.is_null())))
            out.add(E.NullValueError, f"null {col!r}", rows=bad, values={"column": col},
                    fix=f"fill {col!r} on these rows from the collection log, or drop the rows")
            continue
        if pa.types.is_integer(t):
            integers[col] = to_numpy(column).astype(np.int64, copy=False)
        elif pa.types.is_floating(t):
            values = to_numpy(column)
            frac = ~np.isfinite(values) | (values != np.round(values))
            if frac.any():
                cls = E.NonIntegerHeadsError if col in HEAD_COLUMNS else E.ColumnTypeError
                bad = _rows(frac)
                out.add(cls, f"{col!r} holds non-integer values", rows=bad,
                        values={"column": col, "examples": values[bad[:3]].tolist()},
                        fix=f"{col!r} counts things: find how these rows were produced and re-collect them")
            else:
                out.add(E.ColumnTypeError, f"column {col!r} is {t}, expected an integer type",
                        values={"column": col},
                        fix=f"store {col!r} as int64 (its values are whole numbers)")
        else:
            out.add(E.ColumnTypeError, f"column {col!r} is {stored_type(t)}, expected an integer type",
                    values={"column": col}, fix=f"store {col!r} as int64")
    if LATENCY in names:
        column = table.column(LATENCY)
        if not pa.types.is_floating(column.type):
            out.add(E.ColumnTypeError, f"column 'latency' is {stored_type(column.type)}, expected float (ms)",
                    values={"column": LATENCY}, fix="store latency in milliseconds as float64")
        elif column.null_count:
            bad = _rows(np.asarray(to_numpy(column.is_null())))
            out.add(E.NullValueError, "null latency", rows=bad, values={"column": LATENCY},
                    fix="re-measure these rows or drop them")
        else:
            latency = to_numpy(column).astype(np.float64, copy=False)
    return categorical, integers, latency


def _dense_codes(values: np.ndarray) -> tuple[int, np.ndarray]:
    """(number of distinct values, each value's index among them in ascending order): the
    codes :func:`modperf.data.codes.factorize` gives, in the narrowest type over their count, and
    without its int64 temporaries where the values span at most 2**16."""
    if not values.size:
        return 0, values.astype(np.int8)
    low, high = int(values.min()), int(values.max())
    span = high - low + 1
    if span > 1 << 16:
        uniq, codes = factorize(values)
        return int(uniq.size), codes.astype(narrowest_signed(0, uniq.size))
    return dense_ranks(values, low, span)


def _migrate_fix(path: Path, heads: int, no_model_column: bool, registry: ModelRegistry, family: Family) -> str:
    """The command that migrates a stale table (docs/migration.md): a table without a model
    column takes the native from ``--model``, which migrate then requires; any model whose
    native is the constant ``heads`` (and, for a kernel collected at fixed dims, of those dims)
    gives the same rewrite, so one is named."""
    then = "(a dry run: it prints the plan; add --execute to rewrite the file)"
    if not no_model_column:
        return f"run `modperf migrate {path}` {then}"
    dims = dict(family.notes.get("kernel_dims", {})) if family.notes else {}
    named = None
    for model_id in registry.ids():
        try:
            cfg = registry.get(model_id)
            if cfg.native_heads == heads and all(cfg.get(k, None) == v for k, v in dims.items()):
                named = model_id
                break
        except E.ModperfError:
            continue
    if named is None:
        return (f"run `modperf migrate {path} --model MODEL_ID` {then}, with a model whose num_attention_heads is "
                f"{heads}{' and whose dims are ' + str(dims) if dims else ''} (the table has no model column)")
    return (f"run `modperf migrate {path} --model {named}` {then}; the table has no model column, and any model with "
            f"{heads} attention heads{' and the dims the kernel was collected at' if dims else ''} gives the same "
            "rewrite")


def _stale_fingerprint(out: _Collector, model: Categorical | None, version: Categorical | None,
                       integers: dict[str, np.ndarray], path: Path, n: int,
                       migrate_fix: Callable[[int], str]) -> np.ndarray:
    """Inside one (model, version) group, num_heads constant while tp_size varies is the
    retired native convention."""
    # each row's (model, version) group, as its index among the groups present: every array
    # here is in the narrowest type over its count (a 20M-row table held 24-32 B per row of
    # int64 temporaries here)
    card = (len(model.values) if model is not None else 1) * (len(version.values) + 1 if version is not None else 1)
    key = model.codes.astype(narrowest_signed(0, card)) if model is not None else \
        np.zeros(n, dtype=narrowest_signed(0, card))
    if version is not None:
        key *= len(version.values) + 1
        key += version.codes
    n_groups, group = _dense_codes(key)
    del key
    heads, tp = integers[HEADS], integers[TP]
    stale = np.zeros(n, dtype=bool)

    tps_per_group = _distinct_per(group, n_groups, tp)
    heads_per_group = _distinct_per(group, n_groups, heads)
    for g in np.flatnonzero((tps_per_group >= 2) & (heads_per_group == 1)):
        rows = group == g
        stale |= rows
        where = _rows(rows)
        name = model.values[model.codes[where[0]]] if model is not None else None
        out.add(
            E.StaleConventionError,
            "stale head-axis convention: num_heads is constant while tp_size varies "
            "(the retired native convention; rows would key the wrong local count)",
            rows=where,
            values={"model": name, "num_heads": int(heads[where[0]]),
                    "tp_sizes": np.unique(tp[rows]).tolist()},
            fix=migrate_fix(int(heads[where[0]])) + ": num_heads becomes native // tp_size",
        )
    return stale


def _distinct_per(group: np.ndarray, n_groups: int, values: np.ndarray) -> np.ndarray:
    """Per group (``group``: each row's group code below ``n_groups``), how many distinct
    ``values`` its rows hold: one column at a time, its pair code with the group combined in
    place in the narrowest type that holds it."""
    n_values, code = _dense_codes(values)
    combined = group.astype(narrowest_signed(0, n_groups * n_values))
    combined *= n_values
    combined += code
    del code
    return np.bincount(unique_codes(combined) // n_values, minlength=n_groups)


def stale_chain_rows(spec: TableSpec, categorical: dict[str, Categorical], integers: dict[str, np.ndarray],
                     n: int) -> np.ndarray:
    """Rows of chains stored the retired way, in a local-only table that records tp_size.

    A *chain* is the rows equal in every key column but num_heads and tp_size (one shape, one
    dtype set, measured at several tp). Rank-local rows keep ``num_heads * tp_size`` at the
    chain's natives, so a chain holds at least as many distinct head counts as distinct
    products; the native convention keeps ``num_heads`` at the natives, so every tp adds a
    product: more products than head counts, with tp varying, is the stale fingerprint --
    per chain, which catches files mixing several natives' chains (each constant in heads)
    that the per-model fingerprint cannot see."""
    heads, tp = integers[HEADS], integers[TP]
    # every per-row array but the combined key in the narrowest type over its count (a 20M-row
    # table held an int64 code per key column here)
    codes: list[np.ndarray] = []
    cards: list[int] = []
    for name in spec.categorical:
        if name in categorical:
            codes.append(categorical[name].codes)
            cards.append(max(len(categorical[name].values), 1))
    for name in (*spec.discrete, *spec.axes):
        if name in integers and name not in (HEADS, TP):
            count, code = _dense_codes(integers[name])
            codes.append(code)
            cards.append(max(count, 1))
    key = combine(codes, cards, n) if codes else np.zeros(n, dtype=np.int64)
    del codes
    n_chains, chain = _dense_codes(key)
    del key

    tps, heads_n = _distinct_per(chain, n_chains, tp), _distinct_per(chain, n_chains, heads)
    products = _distinct_per(chain, n_chains, _product(heads, tp))
    stale = (tps >= 2) & (products > heads_n)
    return stale[chain]


def _stale_chains(out: _Collector, spec: TableSpec, categorical: dict[str, Categorical],
                  integers: dict[str, np.ndarray], path: Path, n: int) -> np.ndarray:
    rows = stale_chain_rows(spec, categorical, integers, n)
    if rows.any():
        where = _rows(rows)
        heads, tp = integers[HEADS], integers[TP]
        out.add(
            E.StaleConventionError,
            "stale head-axis convention in tp chains: within rows equal in every key but num_heads and tp_size, "
            "num_heads stays at the chain's native while tp_size varies (the retired native convention; the "
            "rows would key the wrong local count)",
            rows=where,
            values={"num_heads": np.unique(heads[rows]).tolist()[:8], "tp_sizes": np.unique(tp[rows]).tolist()[:8]},
            fix=f"run `modperf migrate {path}` (a dry run: it prints the plan; add --execute to rewrite the file): "
                "num_heads becomes num_heads // tp_size on these chains",
        )
    return rows


def _report_by_model(out: _Collector, cls: type[E.ModperfError], bad: np.ndarray, model: Categorical,
                     heads: np.ndarray, tp: np.ndarray, native: np.ndarray, message: str, fix: str) -> None:
    # only the offending rows, usually few: a sort here is cheap
    combos = np.unique(np.stack([model.codes[bad], heads[bad], tp[bad]]), axis=1)
    for m_code, h, t in combos.T:
        rows = _rows(bad & (model.codes == m_code) & (heads == h) & (tp == t))
        nat = int(native[rows[0]])
        out.add(cls, message, rows=rows,
                values={"model": model.values[m_code], "num_heads": int(h), "tp_size": int(t),
                        "native": nat, "expected_num_heads": nat / int(t) if nat % int(t) else nat // int(t)},
                fix=fix)


def _native_contract(out: _Collector, model: Categorical, heads: np.ndarray, tp: np.ndarray,
                     native: np.ndarray, known: np.ndarray, local_heads: np.ndarray | None) -> None:
    bad = known & (heads != native)
    if bad.any():
        _report_by_model(
            out, E.NativeContractError, bad, model, heads, tp, native,
            "native-keyed table: num_heads must be the model's native count on every row",
            "this table is native-keyed by contract; do not migrate it: re-collect the rows with num_heads = "
            "num_attention_heads of the model",
        )
    if local_heads is not None:
        bad = known & (_product(local_heads, tp) != heads)
        if bad.any():
            _report_by_model(
                out, E.RankLocalError, bad, model, local_heads, tp, native,
                "local_num_heads * tp_size != num_heads (native)",
                "local_num_heads must be native // tp_size; re-collect these rows",
            )


def _collisions(out: _Collector, family: Family, table: str, configs: dict[str, ModelConfig],
                geometry: dict[str, tuple[tuple[str, Any], ...]]) -> None:
    by_native: dict[int, dict[tuple, list[str]]] = {}
    for name, geo in geometry.items():
        by_native.setdefault(configs[name].native_heads, {}).setdefault(geo, []).append(name)
    for nat, groups in sorted(by_native.items()):
        if len(groups) < 2:
            continue
        geos = sorted(groups, key=lambda g: sorted(groups[g]))
        groups = {g: groups[g] for g in geos}
        differing = sorted({k for (k, v) in geos[0] if any(dict(g)[k] != v for g in geos[1:])})
        out.add(
            E.GeometryCollisionError,
            f"models with different {family.title} geometry share native bucket {nat}",
            values={"native": nat, "models": [sorted(v) for v in groups.values()],
                    "differing_fields": {k: [dict(g)[k] for g in geos] for k in differing}},
            fix=f"split the file by model, or, if the configs are wrong, correct them; the {family.name} "
                f"family reads {', '.join(f.name for f in family.geometry_for(table))}",
        )
