"""The Family type: one declaration per family of perf tables.

A family says which tables it covers, the columns that key a row, how the head axis is keyed
(its tier), where the native head count comes from, which HF config fields determine the
module's computation (its geometry), and the axes a query interpolates on. The loaders,
``check``, queries and audits read these declarations; adding a family is adding one module
under ``modperf/families/`` that calls :func:`register`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..models import ConfigField
from ..roofline import GpuSpec, WorkFn, WorkModel, default_work


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


# Column roles shared by every family.
HEADS = "num_heads"
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


#: Decides, per row, where a zero latency is a real measurement rather than a defect.
#: Receives the table's columns (numpy arrays) and a function giving, for an HF config field,
#: its value on every row (from the row's model); returns a boolean mask of allowed rows.
ZeroLatencyRule = Callable[[Mapping[str, np.ndarray], Callable[[str], np.ndarray]], np.ndarray]


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
    #: False for supporting tables without heads (GEMMs that a model-level estimate adds to
    #: GQA attention); they are keyed by their other columns alone.
    head_axis: bool = True
    #: The backend's dispatch among kernels by shape, where one is declared.
    lane: LaneRule | None = None

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
    #: Head-bearing families are what ``check`` validates; supporting tables (GEMMs) are not.
    head_bearing: bool = True
    #: The work model extrapolation holds utilisation against (modperf.roofline); None: the
    #: attention-shaped default.
    work: WorkFn | None = None
    #: The key column holding rank-local kv heads, where the family keys them (GQA kernels):
    #: model-level code shards the model's kv heads into it (modperf.deployment).
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
                   gpu: GpuSpec) -> WorkModel:
        """The roofline work model of one bucket group of ``table`` (key: its categorical and
        discrete key values; geometry: the module's config fields, empty for local-only tables)."""
        return (self.work or default_work)(table, phase, key, geometry, gpu)

    @property
    def table_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.tables)

    @property
    def keys_native(self) -> bool:
        return self.tier is not Tier.LOCAL


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


def head_bearing_tables() -> tuple[str, ...]:
    return tuple(t for t, fam in _BY_TABLE.items() if fam.head_bearing)


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
