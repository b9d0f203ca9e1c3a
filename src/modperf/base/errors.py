"""Typed errors. Every failure modperf reports names where it is (file, rows), what it saw
(values) and how to fix it, so that a person can act on the message alone.

Row numbers are 0-based positions in the file as stored (the index pandas or pyarrow shows).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Mapping, Sequence

TYPE_CHECKING = False
if TYPE_CHECKING:  # (typing costs a cold process ~5 ms: annotations only)
    from typing import Any

#: How many row numbers a message lists before it summarises the rest as a count.
ROWS_SHOWN = 5
#: Longest message text (detail, fix, file) an error keeps; the rest is elided with its length.
MAX_TEXT = 2000
#: Longest string an error's ``values`` keep, and most items of a list there.
MAX_VALUE_CHARS = 200
MAX_VALUE_ITEMS = 100
#: Characters never written raw: C0 and C1 controls (ESC starts terminal sequences) and the
#: bidirectional overrides that reorder what a terminal shows.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def escape_controls(text: str) -> str:
    """``text`` with every control character written as its escape (ESC as ``\\x1b``)."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def clean(text: str, limit: int = MAX_TEXT) -> str:
    """Text fit for a message: control characters escaped, at most ``limit`` characters kept."""
    text = escape_controls(text)
    if len(text) > limit:
        return f"{text[:limit]}... [{len(text) - limit:,} more characters]"
    return text


def quote(value: Any, limit: int = 120) -> str:
    """A user-given value quoted for a message: ``repr`` of at most ``limit`` characters (a
    longer one says how long it was), control characters escaped."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        return f"{escape_controls(repr(text[:limit]))}... ({len(text):,} characters)"
    return escape_controls(repr(text))


def describe_rows(rows: Sequence[int], total: int | None = None) -> str:
    total = len(rows) if total is None else total
    shown = ", ".join(str(r) for r in list(rows)[:ROWS_SHOWN])
    word = "row" if total == 1 else "rows"
    if total > ROWS_SHOWN:
        return f"{word} {shown}, ... ({total} rows)"
    return f"{word} {shown}"


_AS_IS = frozenset({int, float, bool, type(None)})


def _plain(value: Any, depth: int = 0) -> Any:
    """numpy scalars and tuples to JSON-friendly Python values; strings cleaned and bounded,
    long lists cut, deep nesting summarised (a message never grows with what a user typed)."""
    if type(value) in _AS_IS:  # (most values: no attribute lookups)
        return value
    if hasattr(value, "item") and not isinstance(value, (list, tuple, dict)):
        with contextlib.suppress(ValueError, TypeError):
            value = value.item()
    if isinstance(value, str):
        return clean(value, MAX_VALUE_CHARS)
    if isinstance(value, bytes):
        return clean(repr(value), MAX_VALUE_CHARS)
    if isinstance(value, (list, tuple, set, frozenset, Mapping)) and depth >= 8:
        return f"<{type(value).__name__} nested too deep to show>"
    if isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
        shown = [_plain(v, depth + 1) for v in items[:MAX_VALUE_ITEMS]]
        if len(items) > MAX_VALUE_ITEMS:
            shown.append(f"... ({len(items):,} items)")
        return shown
    if isinstance(value, Mapping):
        pairs = list(value.items())
        out = {clean(str(k), MAX_VALUE_CHARS): _plain(v, depth + 1) for k, v in pairs[:MAX_VALUE_ITEMS]}
        if len(pairs) > MAX_VALUE_ITEMS:
            out["..."] = f"{len(pairs):,} entries"
        return out
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return clean(str(value), MAX_VALUE_CHARS)


class ModperfError(Exception):
    """Base of every error modperf raises on purpose."""

    #: Stable machine-readable name, also the JSON ``kind`` field.
    kind = "error"
    #: Process exit code the CLI uses when this error ends a command.
    exit_code = 1
    #: What ``modperf check`` makes of this kind of finding: ``"failure"`` (data that would be
    #: read wrongly or not at all: exit 1) or ``"warning"`` (readable and unambiguous, but out
    #: of place or unusual: listed with its fix, exit 0; ``check --strict`` fails on it too).
    severity = "failure"

    def __init__(
        self,
        message: str,
        *,
        file: Any = None,
        rows: Iterable[int] | None = None,
        row_count: int | None = None,
        values: Mapping[str, Any] | None = None,
        fix: str | None = None,
    ) -> None:
        self.detail = clean(message)
        self.file = clean(str(file)) if file is not None else None
        self.rows = [int(r) for r in rows] if rows is not None else []
        self.row_count = row_count if row_count is not None else len(self.rows)
        self.values = {clean(str(k), MAX_VALUE_CHARS): _plain(v) for k, v in (values or {}).items()}
        self.fix = clean(fix) if fix is not None else None
        super().__init__(self.render())

    def render(self) -> str:
        where = []
        if self.file:
            where.append(self.file)
        if self.rows:
            where.append(describe_rows(self.rows[:ROWS_SHOWN], self.row_count))
        text = self.detail
        if where:
            text = f"{': '.join(where)}: {text}"
        if self.values:
            text += " [" + ", ".join(f"{k}={v!r}" for k, v in self.values.items()) + "]"
        if self.fix:
            text += f". Fix: {self.fix}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "kind": self.kind,
            "message": str(self),
            "file": self.file,
            "rows": self.rows[:ROWS_SHOWN],
            "row_count": self.row_count,
            "values": self.values,
            "fix": self.fix,
        }


# --- usage: the request itself is wrong (CLI exit code 2) -------------------------------


class UsageError(ModperfError):
    kind = "usage"
    exit_code = 2


class DataRootError(UsageError):
    kind = "data_root"


class UnknownTableError(UsageError):
    kind = "unknown_table"


class ModelConfigsFolderError(UsageError):
    """A --model-configs (or MODPERF_MODEL_CONFIGS) folder that does not exist or cannot be listed."""

    kind = "model_configs"


# --- the data root itself: parts that cannot be read, listed or trusted (exit 1) ---------


class DataLayoutError(ModperfError):
    """A part of a data root that cannot be read or listed, or is malformed. Reported as a
    failure (``modperf check``), never skipped."""

    kind = "data_layout"


class UnreadableFolderError(DataLayoutError):
    kind = "unreadable_folder"


class SidecarError(DataLayoutError):
    """A reuse.yaml or collection_meta.yaml that is not valid YAML or not the expected shape."""

    kind = "sidecar"


class LinkOutsideRootError(DataLayoutError):
    """A table (or folder) that is a symbolic link to somewhere outside the data root: not read."""

    kind = "link_outside_root"


class StaleTempFileError(DataLayoutError):
    """A temporary file a modperf write left behind (the writing process was killed)."""

    kind = "stale_temp_file"


# --- model configs ----------------------------------------------------------------------


class ModelError(ModperfError):
    kind = "model"


class UnknownModelError(ModelError):
    """No config for a model id. When a user names the model (query, estimate, coverage,
    migrate --model) it ends the command as a usage error; inside a table, check collects it."""

    kind = "unknown_model"
    exit_code = 2


class ModelConfigError(ModelError):
    """A config exists but cannot answer what a family needs (missing field, bad JSON)."""

    kind = "model_config"


# --- table content: the loaders' guards -------------------------------------------------


class TableError(ModperfError):
    kind = "table"


class UnreadableTableError(TableError):
    kind = "unreadable"


class DuplicateColumnError(UnreadableTableError):
    """Two columns of one table share a name: which one keys the rows cannot be told."""

    kind = "duplicate_column"


class EmptyTableError(TableError):
    kind = "empty_table"


class ValueRangeError(TableError):
    """A key column value outside its documented range (docs/limits.md)."""

    kind = "value_range"


class MissingColumnError(TableError):
    kind = "missing_column"


class ColumnTypeError(TableError):
    kind = "column_type"


class UnexpectedColumnError(TableError):
    """A column the family does not declare: it might key rows we would otherwise merge."""

    kind = "unexpected_column"


class InvalidHeadsError(TableError):
    """num_heads or tp_size outside its range: zero or negative, or beyond the documented
    maximum (docs/limits.md), where products of heads and tp would overflow."""

    kind = "invalid_heads"


class NullValueError(TableError):
    kind = "null_value"


class NonIntegerHeadsError(TableError):
    kind = "non_integer_heads"


class InvalidLatencyError(TableError):
    kind = "invalid_latency"


class RankLocalError(TableError):
    """A tp>1 row whose num_heads * tp_size is not the model's native head count."""

    kind = "not_rank_local"


class StaleConventionError(TableError):
    """num_heads constant while tp_size varies within one (model, version): the retired
    native convention."""

    kind = "stale_convention"


class NativeContractError(TableError):
    """A native-keyed (sparse-kernel) row whose num_heads is not the model's native count."""

    kind = "native_contract"


class GeometryCollisionError(TableError):
    """Two models share a native bucket but their module geometry differs."""

    kind = "geometry_collision"


class ArchitectureMismatchError(TableError):
    """A row's architecture column disagrees with its model's HF config."""

    kind = "architecture_mismatch"


class MisplacedTableError(TableError):
    """A collective library's table found outside {system}/comm/{library}/{release}/ whose rows
    record one release: it is read as that release's table (served in its slot, or a
    re-measurement of what that slot's own file holds). A warning: nothing is read wrongly."""

    kind = "misplaced_table"
    severity = "warning"


class MisplacedUnservedError(TableError):
    """A collective library's table outside its library's folder that no slot can serve
    without losing or guessing data: its rows record no release or several, another misplaced
    file claims the same release, or it holds keys that the release's own file lacks."""

    kind = "misplaced_unserved"


class SystemSpecError(TableError):
    """A derived column needs the system's spec (GPUs per node) and none is known for the file."""

    kind = "system_spec"


class InvariantError(TableError):
    """A relation the family declares between a row's columns does not hold."""

    kind = "invariant"


class ConventionError(TableError):
    """The data follows another convention than the family declares for a column (a global
    quantity stored per rank, bytes stored as elements, ...), shown by how latency moves along
    a key or by the keys' own fingerprint."""

    kind = "convention"


class DuplicateSpreadError(TableError):
    """Rows sharing a full key disagree systematically: they stand for different work."""

    kind = "duplicate_spread"


class BeyondRooflineError(TableError):
    """Rows faster than the machine's roofline allows for the work their key declares."""

    kind = "beyond_roofline"


class UnitsError(TableError):
    """Latencies outside what the declared unit allows."""

    kind = "units"


class TableRejectedError(TableError):
    """Raised by strict loading when a table has failures; carries all of them."""

    kind = "table_rejected"

    def __init__(self, file: Any, failures: Sequence[ModperfError]) -> None:
        self.failures = list(failures)
        kinds = sorted({f.kind for f in self.failures})
        first = str(self.failures[0]) if self.failures else ""
        super().__init__(
            f"table rejected with {len(self.failures)} failure(s) ({', '.join(kinds)}); first: {first}",
            file=file,
            fix="run `modperf check` on this file to see every failure and its fix",
        )

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["failures"] = [f.to_dict() for f in self.failures]
        return d


# --- migration and the collector-side writer ---------------------------------------------


class MigrationRefusedError(ModperfError):
    """``modperf migrate`` will not rewrite this table: it does not show the pattern the
    migration asserts, or the result would still fail a guard. Nothing is written."""

    kind = "migration_refused"


class PartlyStaleError(MigrationRefusedError):
    """(model, version) groups where some tp>1 rows hold the native count and others do not:
    which rows are stale cannot be told, so nothing is guessed."""

    kind = "partly_stale"


class HeadsNotDivisibleError(MigrationRefusedError):
    """native // tp_size is not a whole number of heads for some rows."""

    kind = "heads_not_divisible"


class FillUndecidedError(MigrationRefusedError):
    """A legacy table lacks a column the corpus schema has, and the corpus does not decide
    its value."""

    kind = "fill_undecided"


class MigrationVerificationError(ModperfError):
    """What was written does not match the plan; the original was left in place."""

    kind = "verification_failed"


class ModelRequiredError(UsageError):
    """The table records no model, so the native head count needs ``--model``."""

    kind = "model_required"


class TargetExistsError(UsageError):
    kind = "target_exists"


class TargetConflictError(UsageError):
    """Two inputs would be written to the same file."""

    kind = "target_conflict"


class PathOutsideOutputError(UsageError):
    kind = "path_outside_output"


class OutputNotOwnedError(UsageError):
    """A write would replace a file modperf did not write (pass --force to replace it)."""

    kind = "not_owned"


class WriteFailedError(ModperfError):
    """Writing the temporary file (or renaming it) failed; the target is unchanged and the
    temporary file is gone."""

    kind = "write_failed"


class WriterError(ModperfError):
    """Raised by ``modperf.audit.writer`` at the call that caused it."""

    kind = "writer"


class UnknownMeasurementColumnError(WriterError, UnexpectedColumnError):
    kind = "unknown_measurement_column"


class MissingMeasurementKeyError(WriterError, MissingColumnError):
    kind = "missing_measurement_key"


class MeasurementValueError(WriterError, ColumnTypeError):
    """A key value of the wrong type or range, or one that contradicts a value fixed when
    the writer was opened."""

    kind = "measurement_value"


class MeasurementLatencyError(WriterError, InvalidLatencyError):
    kind = "measurement_latency"


class MeasurementRankLocalError(WriterError, RankLocalError):
    kind = "measurement_not_rank_local"


class NativeSweepError(WriterError, StaleConventionError):
    """A tp sweep that records the model's native head count on every tp: the retired
    native convention."""

    kind = "native_sweep"


class SidecarConflictError(WriterError):
    """The folder's collection_meta.yaml describes another runtime than the writer's."""

    kind = "sidecar_conflict"


class WrittenTableRejectedError(WriterError, TableRejectedError):
    """The measurements, taken together, fail a loader guard; nothing was written."""

    kind = "written_table_rejected"


# --- queries (modperf.query.engine) ------------------------------------------------------------


class QueryFieldError(UsageError):
    """A query field that is missing, unknown, of the wrong type, or inconsistent with
    another field; the message lists the table's key columns."""

    kind = "query_field"


class ContradictionError(QueryFieldError):
    """A field the user gave contradicts what the model (its config, its checkpoint, the
    deployment) fixes; the message names the field, the value given, the value derived and why."""

    kind = "contradiction"


class ShardError(QueryFieldError):
    """tp_size does not divide the native head count (or num_heads * tp_size != native)."""

    kind = "shard"


class DeploymentFitError(UsageError):
    """A deployment that cannot run: its weights, or one request's KV cache, exceed a GPU's
    memory in one of its pools. The message gives the figures."""

    kind = "does_not_fit"


class NotCoveredError(ModperfError):
    """The table holds no bucket for the requested key: a native head count it never measured,
    or a key (dtype, kernel, kv heads...) it does not hold. Lists what it does hold."""

    kind = "not_covered"


class OutOfCoverageError(ModperfError):
    """The point lies farther outside the measured grid than the documented extrapolation
    limit (docs/queries.md), or in a region of a ragged grid no measurement reaches."""

    kind = "out_of_coverage"


# --- audits: dedupe, coverage, quality (issue 5) ----------------------------------------


class OptionValueError(UsageError):
    """An option value the audit commands cannot use (a tolerance below zero, a tp list that
    is not positive integers, a version that exists nowhere)."""

    kind = "option_value"


class MissingExtraError(UsageError):
    """An optional dependency (matplotlib for --plot) is not installed."""

    kind = "missing_extra"


class DedupeOutputError(UsageError):
    """``dedupe --write`` would overwrite a source table or write inside the data root it reads."""

    kind = "dedupe_output"


class DedupeVerifyError(ModperfError):
    """A de-duplicated table failed verification (it does not load cleanly, or it would answer
    a query differently from its source); it was not written."""

    kind = "dedupe_verify"
