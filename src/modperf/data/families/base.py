"""The Family type: one declaration per family of perf tables.

A family says which tables it covers, the columns that key a row, how the head axis is keyed
(its tier), where the native head count comes from, which HF config fields determine the
module's computation (its geometry), and the axes a query interpolates on. The loaders,
``check``, queries and audits read these declarations; adding a family is adding one module
under ``modperf/families/`` that calls :func:`register`.

A table also declares how it is stored and what its numbers mean (docs/families.md):

* its latency column and unit (:class:`Measure`; the loader converts to ms), columns stored
  under another name (``renames``), phases stored side by side in one row (:class:`Unpivot`),
  and columns the loader computes (:class:`Derived`, e.g. an EP size from the node count);
* which quantities are what one rank ran and which are global (:class:`Quantity`, with the
  counterpart named beside it), and the columns carried without keying (``carried``);
* the guards that catch the other convention, checked on the data (:mod:`modperf.data.conventions`
  runs them): row relations, sharded-key fingerprints, latency scaling along an axis,
  duplicate agreement, a roofline ceiling, config and architecture checks;
* for collective-library tables, the library whose release versions them (``library``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...fast.answer import HEADS
from ...specs.models import ConfigField
from ...specs.roofline import AxisWork, GpuSpec, RowRoof, WorkFn, WorkModel, default_work


class Tier(str, enum.Enum):  # noqa: UP042  (StrEnum would change str() and format() of members)
    """How a family keys its head axis."""

    #: The local key (local heads, kv heads, head_dim, window...) fully determines the
    #: computation; native adds nothing. Buckets are keyed by local heads only.
    LOCAL = "local"
    #: The module reads model variables outside the local key (lora ranks, hidden size,
    #: indexer geometry), so the same local count under two natives is two modules.
    NATIVE_LOCAL = "native+local"
    #: Sparse-kernel tables whose ``num_heads`` is the model's native count by contract.
    NATIVE = "native"


class NativeSource(str, enum.Enum):  # noqa: UP042  (StrEnum would change str() and format() of members)
    MODEL_CONFIG = "model_config"  # num_attention_heads of the row's model
    HEADS_TIMES_TP = "num_heads*tp_size"  # tables without a model column, where tp is recorded
    NONE = "none"  # no tp_size and no model: native is not recorded (local-only tier)


# Column roles shared by every family (HEADS, the rank-local head count, is modperf.fast.answer's).
TP = "tp_size"
MODEL = "model"
ARCHITECTURE = "architecture"
LATENCY = "latency"
#: Written by ``modperf dedupe --write``: every model name that measured the row's key.
MEASURED_BY = "measured_by"
#: Columns that describe where a measurement came from, never part of a key.
PROVENANCE_COLUMNS = ("framework", "version", "device", MODEL, ARCHITECTURE, MEASURED_BY)
#: Measured alongside latency in some files; carried, not keyed.
EXTRA_MEASUREMENTS = ("power", "power_limit")
#: Key columns that name a dtype. A dtype is the deployment's choice (docs/queries.md): a query
#: takes the value given over any default, and a key the table never measured is answered by the
#: dtypes it did measure for those keys (the fix of the miss names them).
DTYPE_KEYS = frozenset({"attn_dtype", "kv_cache_dtype", "mla_dtype", "gemm_type", "gemm_dtype", "bmm_dtype",
                        "moe_dtype", "comm_dtype", "allreduce_dtype", "nccl_dtype", "quant_dtype", "quant_type",
                        "kernel_dtype"})


#: Decides, per row, where a zero latency is a real measurement rather than a defect.
#: Receives the table's columns (numpy arrays) and a function giving, for an HF config field,
#: its value on every row (from the row's model; tables without a model column have none);
#: returns a boolean mask of allowed rows.
ZeroLatencyRule = Callable[[Mapping[str, np.ndarray], Callable[[str], np.ndarray]], np.ndarray]

#: Divisor from a declared latency unit to milliseconds (a division by 1.0 keeps ms tables
#: bit for bit; microseconds are divided by 1000).
UNIT_DIVISOR = {"ms": 1.0, "us": 1000.0}

#: What a quantity stands for: what one rank ran, the whole model/group, or the model's
#: native (unsharded) value on every row.
PER_RANK, GLOBAL, NATIVE_VALUE = "per_rank", "global", "native"


@dataclass(frozen=True)
class Measure:
    """Where a table stores its latency and in which unit (the loader converts to ms)."""

    column: str = LATENCY
    unit: str = "ms"

    def __post_init__(self) -> None:
        if self.unit not in UNIT_DIVISOR:
            raise ValueError(f"unknown latency unit {self.unit!r} (known: {', '.join(UNIT_DIVISOR)})")


@dataclass(frozen=True)
class Unpivot:
    """A stored row holding several phases side by side (DeepEP: dispatch and combine). The
    loader makes one row per phase, ``key`` naming it; each phase's columns are the sum of the
    stored columns listed (``latency`` = transmit + notify). Error rows name the stored row."""

    key: str
    #: phase value -> {column of the loaded row -> stored columns summed into it}
    phases: Mapping[str, Mapping[str, tuple[str, ...]]]

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c for cols in self.phases.values() for src in cols.values() for c in src))


#: Computes a derived column: (the table's columns as numpy arrays -- strings as object
#: arrays --, the system's GPU and node spec) -> one value per row.
DeriveFn = Callable[[Mapping[str, np.ndarray], GpuSpec], np.ndarray]


@dataclass(frozen=True)
class Derived:
    """A column the loader computes from stored ones. It keys rows where the table lists it
    among its key columns (a DeepEP table's EP size), else it is carried. A derived column named
    like a stored one replaces it (oneCCL's all_gather size, stored per rank, keyed whole)."""

    name: str
    formula: str  # how it is computed, for people (docs, describe_family, error messages)
    sources: tuple[str, ...]  # stored columns it reads
    compute: DeriveFn
    #: Needs the system's node spec (GPUs per node): refused for a file outside the
    #: {system}/... layout or a system without a spec file, never guessed.
    needs_system: bool = False


@dataclass(frozen=True)
class Quantity:
    """What a column's numbers stand for: ``per_rank`` (what one rank ran), ``global`` (the
    model's or the whole group's; one rank runs a share of it) or ``native`` (the model's
    unsharded value on every row). ``beside`` names the counterpart, e.g. the per-rank slice
    of a global quantity or the global total stored beside a per-rank one."""

    column: str
    scope: str
    meaning: str
    beside: str | None = None

    def __post_init__(self) -> None:
        if self.scope not in (PER_RANK, GLOBAL, NATIVE_VALUE):
            raise ValueError(f"quantity scope must be {PER_RANK}, {GLOBAL} or {NATIVE_VALUE}, not {self.scope!r}")


# --- guards: checked on the data by modperf.data.conventions -----------------------------------


@dataclass(frozen=True)
class RowRule:
    """Every row must satisfy a relation between its columns: ``holds(columns, system)`` is
    True where it does (string columns arrive as object arrays; ``system`` is the file's GPU and
    node spec, None where unknown: a rule that needs it then holds vacuously, and says so)."""

    name: str
    columns: tuple[str, ...]
    holds: Callable[[Mapping[str, np.ndarray], GpuSpec | None], np.ndarray]
    why: str
    fix: str


@dataclass(frozen=True)
class ShardedKey:
    """``column`` is a global quantity that ``by`` ranks share (one rank runs column // by).
    Guards: the division is exact on every row, and the per-rank fingerprint is absent: inside
    a group of otherwise equal keys, ``column * by`` must not be one value at two ``by`` sizes
    with ``column`` changing (what a table storing each rank's slice looks like)."""

    column: str
    by: str
    fix: str


@dataclass(frozen=True)
class Scaling:
    """How latency must move along one step of the key, checked on the data: over every pair of
    stored points whose keys differ only by ``step`` (an integer column times a factor, or a
    categorical column from one value to another), the median latency ratio (stepped / base)
    lies in [low, high]. The other convention for the column puts it elsewhere. Base points
    must have each ``at_least`` column at or above its value; fewer than ``min_pairs`` pairs
    decide nothing (the table does not measure the step)."""

    name: str
    step: Mapping[str, int | tuple[str, str]]
    expect: str  # what the declared convention predicts, and why
    other: str  # what the other convention gives instead
    fix: str
    low: float | None = None
    high: float | None = None
    at_least: Mapping[str, int] = field(default_factory=dict)
    min_pairs: int = 8


@dataclass(frozen=True)
class DuplicateSpread:
    """Rows sharing a full key are re-measurements: their median relative spread (max / min - 1
    per key, the median over keys) stays within ``limit``. Rows that differ systematically at one
    key stand for different work (a key column that is missing, or a sharded quantity stored
    unsharded), which the lower-median rule would silently fold. With ``within``, only rows that
    also share that (carried) column count: the models of a linear-attention sweep share local
    shapes by design, but one model measures each shape once."""

    fix: str
    limit: float = 0.25
    within: str | None = None
    #: Fewer duplicated keys than this decide nothing about their spread.
    min_keys: int = 8


@dataclass(frozen=True)
class Ceiling:
    """No row may beat one component of its roofline (``Family.roof``, evaluated on every row:
    ``compute``, ``memory`` or ``link``) by more than ``limit``: achieved utilisation = that
    component's time / latency. A row faster than the machine allows was stored in another
    convention (a global shape beside one rank's latency, bytes read as elements). Only the
    component that is a hard bound is compared (HBM traffic is not one while operands sit in
    the L2 cache; ``where`` restricts a memory ceiling to rows beyond it). Skipped for a system
    without a spec file."""

    limit: float
    component: str  # "compute" | "memory" | "link"
    rate: str  # the rate, for messages ("the dtype's tensor-core peak: 2mnk / latency")
    fix: str
    where: Callable[[Mapping[str, Any]], np.ndarray] | None = None
    where_text: str = ""

    def __post_init__(self) -> None:
        if self.component not in ("compute", "memory", "link"):
            raise ValueError(f"a ceiling bounds compute, memory or link time, not {self.component!r}")


@dataclass(frozen=True)
class LatencyFloor:
    """Every non-zero latency is at least ``ms``: a unit check for tables declared in
    microseconds (a table that stored milliseconds would land far below a microsecond)."""

    ms: float
    fix: str


@dataclass(frozen=True)
class ConfigHeads:
    """Rows name their model in ``model_column`` (provenance; models without a config are not
    checked). Per model, each (column, config field) pair must hold the ``per_rank`` share of
    the config's value for one integer tp common to all pairs, or the ``native`` value itself."""

    model_column: str
    fields: tuple[tuple[str, str], ...]
    stored: str
    fix: str


@dataclass(frozen=True)
class ArchitectureFields:
    """Rows name an architecture; each (column, config field) value must be that field of some
    model config of that architecture (the registry's configs)."""

    architecture_column: str
    fields: tuple[tuple[str, str], ...]
    fix: str


Guard = RowRule | ShardedKey | Scaling | DuplicateSpread | Ceiling | LatencyFloor | ConfigHeads | ArchitectureFields


#: A predicate on a query point: receives the axis values (ints, or numpy arrays of one shape)
#: and returns a bool or a boolean array.
PointTest = Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class LaneRule:
    """How a backend picks among kernels (the values of ``column``) by shape, where they
    partition the shape space: a query that leaves ``column`` out takes the lane the backend
    would run. ``partition`` receives the lanes the matching buckets hold and the module's
    geometry, and returns ``(lane, test, reason)`` triples whose tests are true on disjoint
    points covering every point -- or None where the lanes are not the ones the rule knows
    (then the query keeps the error that lists them)."""

    column: str
    description: str
    partition: Callable[[Sequence[str], Mapping[str, Any]], list[tuple[str, PointTest, str]] | None]


@dataclass(frozen=True)
class TableSpec:
    """Key layout of one table stem."""

    name: str
    phase: str  # "context" | "generation" | "kernel"
    categorical: tuple[str, ...]  # string key columns
    discrete: tuple[str, ...]  # integer key columns that are never interpolated
    axes: tuple[str, ...]  # integer key columns a query interpolates on, batch first
    seq_axis: str | None  # the sequence axis (blended in sqrt space for context tables)
    optional: frozenset[str] = frozenset()  # key columns some files of this table lack
    #: Overrides the family's geometry where one family spans kernels of different models.
    geometry: tuple[ConfigField, ...] | None = None
    #: Where a zero latency is a real measurement (a no-op by construction), else None.
    zero_latency_rule: ZeroLatencyRule | None = None
    zero_latency_note: str | None = None
    #: False for tables without a num_heads column (GEMMs, MoE, communication, ...); they are
    #: keyed by their other columns alone.
    head_axis: bool = True
    #: The backend's dispatch among kernels by shape, where one is declared.
    lane: LaneRule | None = None
    #: Where and in which unit the latency is stored.
    latency: Measure = Measure()
    #: Stored column name -> the name the family keys it under (``num_token`` -> ``num_tokens``).
    renames: Mapping[str, str] = field(default_factory=dict)
    unpivot: Unpivot | None = None
    derived: tuple[Derived, ...] = ()
    #: Columns read but never keyed (measured by-products, configuration, provenance).
    carried: tuple[str, ...] = ()
    quantities: tuple[Quantity, ...] = ()
    guards: tuple[Guard, ...] = ()
    #: Versioned by this collective library's release: the table lives in
    #: {system}/comm/{library}/{release}/, whatever framework measured it.
    library: str | None = None

    @property
    def heads(self) -> tuple[str, ...]:
        return (HEADS,) if self.head_axis else ()

    @property
    def integer_keys(self) -> tuple[str, ...]:
        return (*self.discrete, *self.heads, *self.axes)

    @property
    def key_columns(self) -> tuple[str, ...]:
        """Every column that keys a stored row (the native, where derived, is added)."""
        return (*self.categorical, *self.discrete, *self.heads, *self.axes)


@dataclass(frozen=True)
class Family:
    """One table family, declared once under ``modperf/families/`` (docs/families.md)."""

    name: str
    title: str
    tier: Tier
    native_source: NativeSource
    tables: tuple[TableSpec, ...]
    #: HF config fields the module's computation reads (beyond num_attention_heads).
    geometry: tuple[ConfigField, ...] = ()
    #: The model column is mandatory (module tiers need a config for the native).
    requires_model: bool = False
    #: tp_size is mandatory.
    requires_tp: bool = False
    #: Apply the stale-fingerprint guard (never for native-keyed-by-contract tables).
    stale_guard: bool = True
    rationale: str = ""
    #: Facts about the family's tables that other code relies on (e.g. the MLA kernel dims).
    notes: Mapping[str, Any] = field(default_factory=dict)
    #: ``num_heads`` is the model's attention head axis (native ``num_attention_heads`` split by
    #: tp): the head-axis tools (coverage's native x tp matrix, migrate, the writer, dedupe's
    #: alias audit) work on these families. ``check`` and queries cover every family.
    model_head_axis: bool = True
    #: The work model extrapolation holds utilisation against (modperf.specs.roofline); None: the
    #: attention-shaped default (or ``roof``).
    work: WorkFn | None = None
    #: Tables without a head axis: the roofline of one row from its columns, the work model of
    #: their query grids and the yardstick of their ceiling guards.
    roof: RowRoof | None = None
    #: The key column holding rank-local kv heads, where the family keys them (GQA kernels):
    #: model-level code shards the model's kv heads into it (modperf.query.deployment).
    kv_heads_key: str | None = None
    #: Whether a row's latency includes the layer's QKV and output projections (module
    #: tables do); where it does not, a model-level estimate adds them from the gemm table.
    projections_in_rows: bool = True

    def spec(self, table: str) -> TableSpec:
        for spec in self.tables:
            if spec.name == table:
                return spec
        raise KeyError(table)

    def geometry_for(self, table: str) -> tuple[ConfigField, ...]:
        spec = self.spec(table)
        return spec.geometry if spec.geometry is not None else self.geometry

    def work_model(self, table: str, phase: str, key: Mapping[str, Any], geometry: Mapping[str, Any],
                   gpu: GpuSpec) -> WorkModel | AxisWork:
        """The roofline work model of one bucket group of ``table`` (key: its categorical and
        discrete key values; geometry: the module's config fields, empty for local-only tables).
        Tables without a head axis get their row roofline over their axes."""
        spec = self.spec(table)
        if self.roof is not None and not spec.head_axis:
            return AxisWork(self.roof, table, dict(key), gpu, spec.axes)
        return (self.work or default_work)(table, phase, key, geometry, gpu)

    @property
    def table_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.tables)

    @property
    def keys_native(self) -> bool:
        return self.tier is not Tier.LOCAL

    @property
    def has_head_axis(self) -> bool:
        """Some table of the family has a num_heads column."""
        return any(s.head_axis for s in self.tables)


_REGISTRY: dict[str, Family] = {}
_BY_TABLE: dict[str, Family] = {}


def register(family: Family) -> Family:
    if family.name in _REGISTRY:
        raise ValueError(f"family {family.name!r} declared twice")
    for table in family.table_names:
        if table in _BY_TABLE:
            raise ValueError(f"table {table!r} declared by {_BY_TABLE[table].name} and {family.name}")
    _REGISTRY[family.name] = family
    for table in family.table_names:
        _BY_TABLE[table] = family
    return family


def registry() -> dict[str, Family]:
    return dict(_REGISTRY)


def family_of(table: str) -> Family | None:
    return _BY_TABLE.get(table)


def declared_tables() -> tuple[str, ...]:
    """Every table stem a family declares: what ``check`` and queries cover."""
    return tuple(_BY_TABLE)


def model_head_axis_tables() -> tuple[str, ...]:
    """Tables whose num_heads is the model's attention head axis (Family.model_head_axis):
    the domain of coverage, migrate, the writer and dedupe."""
    return tuple(t for t, fam in _BY_TABLE.items() if fam.model_head_axis)


def module_spec(
    name: str,
    phase: str,
    *,
    categorical: Sequence[str] = ("op_name", "kernel_source", "mla_dtype", "kv_cache_dtype", "gemm_type"),
    discrete: Sequence[str] = (),
    optional: Sequence[str] = (),
) -> TableSpec:
    """The layout module tables share: batch, isl and step axes; the sequence axis is ``isl``
    for context (new tokens; step is the cached prefix) and ``step`` for generation (the kv
    length already cached; isl is 1)."""
    seq = "isl" if phase == "context" else "step"
    return TableSpec(
        name, phase, tuple(categorical), tuple(discrete), ("batch_size", "isl", "step"), seq,
        frozenset(optional),
    )
