"""The collector-side writer: measurements in, a corpus table out, bad rows refused at the call.

A collector opens one writer per (table, system, backend, version) with what stays fixed for
the whole collection (model, tp_size, dtypes, framework, device, op_name...), then adds one
measurement per call with its rank-local ``num_heads`` (or lets the writer derive it as
``native // tp_size`` from the model's config) and the remaining key columns::

    from modperf.audit.writer import open_writer

    with open_writer("dsv4_csa_context_module", root="data", system="b200_sxm", backend="sglang",
                     version="0.5.14", model="deepseek-ai/DeepSeek-V4-Pro", framework="SGLang",
                     device="NVIDIA B200", op_name="dsv4_csa_context_module",
                     kernel_source="compressed_flashmla", mla_dtype="bfloat16",
                     kv_cache_dtype="fp8_e4m3", gemm_type="fp8_block", compress_ratio=4) as w:
        for tp in (1, 2, 4, 8):
            w.add(0.412, tp_size=tp, batch_size=1, isl=1024, step=0)   # num_heads = 128 // tp

Each ``add`` is checked on the spot, and the error names the measurement (its 0-based index):
an unknown column, a missing key, a value of the wrong type or a value that contradicts one
fixed at open, a latency that is not finite and > 0 ms, ``tp_size > 1`` with
``num_heads * tp_size != native``, and a tp sweep that keeps the native count constant (the
retired convention). A native-keyed sparse-kernel table takes the native count on every row
instead, by its contract.

Closing runs the strict loader's guards over the whole table (duplicates, collisions, the
stale fingerprint for tables whose native comes from ``num_heads * tp_size``), then writes
``{root}/{system}/{family_dir}/{backend}/{version}/{table}_perf.parquet`` in the corpus schema
(:mod:`modperf.data.schema`) and merges the table's entry into the folder's
``collection_meta.yaml``, each atomically (:mod:`modperf.base.atomic`). The parquet file is read
back through the strict loader once, as the temporary file, before it takes its name. Leaving a
``with`` block through an exception writes nothing.

Collectors in other languages write the same layout themselves and gate it with
``modperf check FILE``.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import yaml

from ..base import errors as E
from ..base import limits
from ..base.atomic import stage, text_writer
from ..base.meta import __version__
from ..data.catalog import PARQUET_SUFFIX, TableRef
from ..data.families import Tier, family_of
from ..data.families.base import ARCHITECTURE, HEADS, LATENCY, MODEL, TP
from ..data.loader import load_one
from ..data.parquet_files import parquet_writer
from ..data.schema import corpus_schema
from ..data.validate import validate_table
from ..specs.models import ModelConfig, ModelRegistry

SIDECAR = "collection_meta.yaml"
#: Columns that count heads or ranks: zero or less never ran.
_POSITIVE = (HEADS, TP, "local_num_heads")
#: An integer column that is not a key: any count that fits the int64 column.
_ANY_COUNT = limits.Range(0, limits.INT64.high, "a non-negative 64-bit integer")


@dataclass
class WriteResult:
    table: str
    path: Path
    sidecar: Path
    rows: int
    buckets: int
    natives: list[int]
    models: list[str]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "path": str(self.path), "sidecar": str(self.sidecar), "rows": self.rows,
                "buckets": self.buckets, "natives": self.natives, "models": self.models,
                "seconds": round(self.seconds, 3)}


def _safe_component(name: str, value: str, root: Path) -> str:
    if not isinstance(value, str) or not value or value in (".", "..") or "/" in value or os.sep in value:
        raise E.PathOutsideOutputError(
            f"{name} {value!r} is not a single folder name", file=root, values={name: value},
            fix=f"pass {name} as a plain folder name (e.g. b200_sxm, sglang, 0.5.14)",
        )
    return value


@dataclass
class TableWriter:
    """Collects validated measurements of one table; :meth:`close` writes them. See the module
    docstring; use :func:`open_writer` to create one."""

    table: str
    root: Path
    system: str
    backend: str
    version: str
    model: str | None = None
    tp_size: int | None = None
    family_dir: str | None = None
    status: str = "complete"
    collection: Mapping[str, Any] = field(default_factory=dict)
    overwrite: bool = False
    registry: ModelRegistry | None = None
    fixed: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        family = family_of(self.table)
        if family is None or not family.model_head_axis:
            raise E.UnknownTableError(
                f"{self.table!r} is not a table with the model's head axis", values={"table": self.table},
                fix="the writer writes the tables declared in modperf/families/",
            )
        self.family = family
        self.spec = family.spec(self.table)
        cs = corpus_schema(self.table)
        self.schema: pa.Schema = cs.schema
        self.root = Path(self.root).expanduser()
        self.family_dir = self.family_dir or cs.family_dir
        parts = [_safe_component(n, v, self.root) for n, v in
                 (("system", self.system), ("family_dir", self.family_dir), ("backend", self.backend),
                  ("version", self.version))]
        self.path = self.root.joinpath(*parts, f"{self.table}{PARQUET_SUFFIX}")
        try:
            inside = self.path.resolve().is_relative_to(self.root.resolve())
            exists = self.path.exists() or self.path.is_symlink()
        except OSError as exc:
            raise E.WriteFailedError(f"cannot access the output folder: {exc.strerror or exc}", file=self.path,
                                     fix="check the root folder's permissions") from None
        if not inside:
            raise E.PathOutsideOutputError(
                "the table would be written outside the root folder", file=self.path,
                values={"root": str(self.root), "resolved": str(self.path.resolve())},
                fix="check for a symlink under the root that points elsewhere",
            )
        if exists and not self.overwrite:
            raise E.TargetExistsError("the table already exists", file=self.path,
                                      fix="pass overwrite=True to replace it, or write another version folder")
        self.registry = self.registry or ModelRegistry.default()
        self._types = {f.name: f.type for f in self.schema}
        #: The loader's range for every integer key column (the loader checks the same ones).
        self._ranges = {n: limits.range_of(n) for n in (*self.spec.integer_keys, TP, HEADS, "local_num_heads")}
        self._config: ModelConfig | None = None
        self.native: int | None = None
        if self.model is not None:
            self._config = self.registry.get(self.model)
            self.native = self._config.native_heads

        # what is fixed for every row
        fixed: dict[str, Any] = {"version": self.version}
        if MODEL in self._types:
            if self.model is None:
                raise E.MissingMeasurementKeyError(
                    f"{self.table} records each row's model: open the writer with model=", values={"column": MODEL},
                    fix="pass model='org/Name' (the HF id whose config gives the native head count)",
                )
            fixed[MODEL] = self.model
        if ARCHITECTURE in self._types and ARCHITECTURE not in self.fixed and self._config is not None:
            archs = list(self._config.raw.get("architectures") or [])
            if len(archs) == 1:
                fixed[ARCHITECTURE] = archs[0]
        if self.tp_size is not None:
            fixed[TP] = self.tp_size
        for name, value in self.fixed.items():
            if name == LATENCY:
                raise E.MeasurementValueError("latency is measured per row, not fixed at open",
                                              values={"column": name}, fix="pass it to add()")
            if name in fixed and fixed[name] != value:
                raise E.MeasurementValueError(
                    f"{name}={value!r} contradicts the writer's {name}={fixed[name]!r}", values={"column": name},
                    fix=f"pass {name} once",
                )
            fixed[name] = value
        for name, value in fixed.items():
            self._check_value(name, value, None)
        self._fixed = fixed
        self._columns: dict[str, list[Any]] = {f.name: [] for f in self.schema}
        self._heads_by_tp: dict[int, set[int]] = {}
        self._closed = False
        #: What close() wrote (also after a ``with`` block).
        self.result: WriteResult | None = None
        #: Per-row key columns a measurement must name (the rest are fixed).
        self.row_keys: tuple[str, ...] = tuple(
            n for n in self.schema.names if n not in fixed and n not in (LATENCY, HEADS, "local_num_heads")
        )

    # -- checks ---------------------------------------------------------------------------

    def _fail(self, cls: type[E.ModperfError], message: str, row: int | None, **kwargs: Any) -> E.ModperfError:
        where: dict[str, Any] = {"rows": [row]} if row is not None else {}
        return cls(message, file=self.path, **where, **kwargs)

    def _check_value(self, name: str, value: Any, row: int | None) -> None:
        t = self._types.get(name)
        if t is None:
            raise self._fail(
                E.UnknownMeasurementColumnError,
                f"{name!r} is not a column of {self.table} (corpus schema: {', '.join(self.schema.names)})", row,
                values={"column": name},
                fix="use the corpus column names; a new key column needs a family declaration in modperf/families/",
            )
        if pa.types.is_string(t):
            if not isinstance(value, str) or not value:
                raise self._fail(E.MeasurementValueError, f"{name!r} must be a non-empty string", row,
                                 values={"column": name, "value": repr(value)}, fix=f"pass {name} as text")
        elif pa.types.is_integer(t):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise self._fail(E.MeasurementValueError, f"{name!r} must be an integer", row,
                                 values={"column": name, "value": repr(value)},
                                 fix=f"pass {name} as an int (heads and sizes count things)")
            # the loader's ranges (modperf.base.limits), here at the call: a value close() would refuse (or
            # that does not fit the int64 column, 2**63 and up) never enters the session
            rng = self._ranges.get(name, _ANY_COUNT)
            if not rng.low <= value <= rng.high:
                bound = (f"> {rng.low - 1}" if rng.low > 0 else ">= 0") if value < rng.low else f"at most {rng.high:,}"
                raise self._fail(E.MeasurementValueError,
                                 f"{name!r} must be {bound} (an integer in {rng.describe()}: {rng.what})", row,
                                 values={"column": name, "value": int(value), "range": [rng.low, rng.high]},
                                 fix="a count of zero or less never ran" if name in _POSITIVE and value <= 0
                                 else f"check the {name} value")
        elif pa.types.is_floating(t) and name != LATENCY and (
                isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating))):
            raise self._fail(E.MeasurementValueError, f"{name!r} must be a number", row,
                             values={"column": name, "value": repr(value)}, fix=f"pass {name} as a float")

    def _check_latency(self, latency: Any, row_values: Mapping[str, Any], row: int) -> float:
        if isinstance(latency, bool) or not isinstance(latency, (int, float, np.integer, np.floating)):
            raise self._fail(E.MeasurementLatencyError, "latency must be a number (ms)", row,
                             values={"latency": repr(latency)}, fix="pass the measured latency in milliseconds")
        value = float(latency)
        if math.isfinite(value) and value > 0:
            return value
        if value == 0 and self.spec.zero_latency_rule is not None and self._config is not None:
            columns = {k: np.array([v]) for k, v in row_values.items() if isinstance(v, (int, np.integer))}
            cfg = self._config

            def per_row(field_name: str) -> np.ndarray:
                return np.array([cfg.get(field_name)], dtype=np.int64)

            try:
                if bool(self.spec.zero_latency_rule(columns, per_row)[0]):
                    return value
            except KeyError:
                pass
        note = f"; this table allows 0 only where {self.spec.zero_latency_note}" if self.spec.zero_latency_note else ""
        raise self._fail(E.MeasurementLatencyError, f"latency must be finite and > 0 ms{note}", row,
                         values={"latency": value},
                         fix="do not record a failed or skipped measurement as a latency; skip the point instead")

    def _resolve_heads(self, num_heads: Any, tp: int, row: int) -> int:
        native = self.native
        if self.family.tier is Tier.NATIVE:
            if native is None:
                raise self._fail(E.MissingMeasurementKeyError, "a native-keyed table needs the writer's model", row,
                                 values={"column": MODEL}, fix="open the writer with model=")
            heads = native if num_heads is None else num_heads
            self._check_value(HEADS, heads, row)
            if heads != native:
                raise self._fail(
                    E.MeasurementValueError,
                    "native-keyed table: num_heads must be the model's native count on every row", row,
                    values={"num_heads": heads, "native": native, "tp_size": tp},
                    fix="pass num_heads=native (or leave it out); the local count goes in local_num_heads",
                )
            return int(heads)
        if num_heads is None:
            if native is None:
                raise self._fail(E.MissingMeasurementKeyError,
                                 "num_heads is required: the writer has no model to derive it from", row,
                                 values={"column": HEADS},
                                 fix="pass num_heads (rank-local), or open the writer with model= to derive it")
            if native % tp:
                raise self._fail(E.MeasurementRankLocalError, "native does not divide by tp_size", row,
                                 values={"native": native, "tp_size": tp},
                                 fix="this tp_size cannot shard the model's heads; drop the point")
            return native // tp
        self._check_value(HEADS, num_heads, row)
        heads = int(num_heads)
        if native is not None and tp > 1 and heads * tp != native:
            if heads == native and any(t != tp for t in self._heads_by_tp.get(heads, ())):
                raise self._fail(
                    E.NativeSweepError,
                    "tp sweep with the native head count on every tp_size (the retired native convention)", row,
                    values={"num_heads": heads, "tp_size": tp, "native": native,
                            "tp_sizes_with_these_heads": sorted(self._heads_by_tp[heads] | {tp})},
                    fix=f"record the heads one rank runs: num_heads = {native} // tp_size = {native // tp}"
                        if native % tp == 0 else "record the heads one rank runs: native // tp_size",
                )
            expected = native // tp if native % tp == 0 else native / tp
            raise self._fail(
                E.MeasurementRankLocalError, "tp_size > 1 measurement is not rank-local: num_heads * tp_size != native",
                row, values={"num_heads": heads, "tp_size": tp, "native": native, "expected_num_heads": expected},
                fix="num_heads is the heads one rank runs (native // tp_size); or leave it out to derive it",
            )
        return heads

    # -- API ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._columns[LATENCY])

    def add(self, latency: float, *, num_heads: int | None = None, **keys: Any) -> int:
        """Validate and keep one measurement; returns its 0-based index. Raises a typed
        WriterError subclass naming the measurement, and keeps nothing of it, when it fails."""
        if self._closed:
            raise E.WriterError("the writer is closed", file=self.path, fix="open a new writer")
        row = len(self)
        for name, value in keys.items():
            if name in (LATENCY, HEADS):
                raise self._fail(E.MeasurementValueError, f"pass {name} as its own argument", row,
                                 values={"column": name}, fix="add(latency, num_heads=..., ...)")
            self._check_value(name, value, row)
            if name in self._fixed and self._fixed[name] != value:
                raise self._fail(
                    E.MeasurementValueError, f"{name}={value!r} contradicts {name}={self._fixed[name]!r} fixed at open",
                    row, values={"column": name, "value": value, "fixed": self._fixed[name]},
                    fix=f"open another writer for {name}={value!r}",
                )
        values = {**self._fixed, **keys}
        derived = (LATENCY, HEADS, "local_num_heads") if self.native is not None else (LATENCY, HEADS)
        missing = [n for n in self.schema.names if n not in values and n not in derived]
        if missing:
            raise self._fail(E.MissingMeasurementKeyError, f"missing key column(s) {missing}", row,
                             values={"columns": missing},
                             fix=f"pass {', '.join(missing)} to add(), or fix them when opening the writer")
        tp = int(values[TP]) if TP in values else 1
        if num_heads is None:
            num_heads = self._fixed.get(HEADS)
        if HEADS in self._types:
            values[HEADS] = self._resolve_heads(num_heads, tp, row)
        elif num_heads is not None:
            raise self._fail(E.UnknownMeasurementColumnError, f"{self.table} has no num_heads column", row,
                             values={"column": HEADS}, fix="leave num_heads out")
        if "local_num_heads" in self._types and self.native is not None:
            if "local_num_heads" not in keys:
                values["local_num_heads"] = self.native // tp
            elif values["local_num_heads"] * tp != self.native:
                raise self._fail(E.MeasurementRankLocalError, "local_num_heads * tp_size != native", row,
                                 values={"local_num_heads": values["local_num_heads"], "tp_size": tp,
                                         "native": self.native},
                                 fix="local_num_heads is native // tp_size; or leave it out to derive it")
        values[LATENCY] = self._check_latency(latency, values, row)
        for name in self.schema.names:
            self._columns[name].append(values[name])
        if HEADS in values and TP in values:
            self._heads_by_tp.setdefault(int(values[HEADS]), set()).add(tp)
        return row

    def to_arrow(self) -> pa.Table:
        return pa.Table.from_arrays([pa.array(self._columns[f.name], type=f.type) for f in self.schema],
                                    schema=self.schema)

    @property
    def ref(self) -> TableRef:
        return TableRef(self.table, self.path, self.system, self.family_dir, self.backend, self.version)

    def discard(self) -> None:
        """Drop every measurement; nothing is written."""
        self._closed = True
        for values in self._columns.values():
            values.clear()

    def _sidecar_text(self, rows: int) -> tuple[Path, str]:
        path = self.path.parent / SIDECAR
        header: list[str] = []
        doc: dict[str, Any] = {}
        if path.exists():
            try:
                text = path.read_bytes().decode("utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
                raise E.SidecarConflictError(f"cannot read {SIDECAR}: {reason}", file=path,
                                             fix="repair the file, or move it away") from None
            for line in text.splitlines():
                if line.startswith("#") or not line.strip():
                    header.append(line)
                else:
                    break
            try:
                loaded = yaml.safe_load(text)
            except (yaml.YAMLError, RecursionError, ValueError) as exc:
                where = getattr(exc, "problem_mark", None)
                at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
                raise E.SidecarConflictError(f"cannot parse {SIDECAR}{at}", file=path,
                                             fix="repair the YAML, or move it away") from None
            doc = loaded if isinstance(loaded, dict) else {}
        runtime_doc = doc.get("runtime")
        runtime = runtime_doc if isinstance(runtime_doc, dict) else {}
        for key, mine in (("framework", self.backend), ("version", self.version)):
            theirs = runtime.get(key)
            if theirs is not None and str(theirs) != mine:
                raise E.SidecarConflictError(
                    f"{SIDECAR} says runtime {key} {theirs!r}, the writer {mine!r}", file=path,
                    values={key: theirs, "writer": mine},
                    fix="write to the version folder of this runtime, or correct the sidecar",
                )
        doc.setdefault("schema_version", 1)
        doc.setdefault("provenance", "collected")
        doc["runtime"] = {**runtime, "framework": self.backend, "version": self.version}
        tables_doc = doc.get("tables")
        tables = tables_doc if isinstance(tables_doc, dict) else {}
        entry = {
            "collected_at": _dt.datetime.now(_dt.UTC).date().isoformat(),
            **dict(self.collection),
            "rows": rows,
            "status": self.status,
            "written_by": f"modperf {__version__}",
        }
        tables[f"{self.table}_perf"] = entry
        doc["tables"] = tables
        body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
        return path, ("\n".join(header) + "\n" if header else "") + body

    def close(self) -> WriteResult:
        """Validate the whole table, write parquet + sidecar atomically, read it back strictly."""
        if self._closed:
            raise E.WriterError("the writer is already closed", file=self.path, fix="open a new writer")
        start = time.perf_counter()
        if not len(self):
            raise E.WriterError("no measurements were added; nothing to write", file=self.path,
                                fix="add measurements before closing, or discard() the writer")
        table = self.to_arrow()
        assert self.registry is not None
        _, failures = validate_table(self.ref, self.family, self.registry, table=table)
        if failures:
            raise E.WrittenTableRejectedError(self.path, failures)
        sidecar_path, sidecar_text = self._sidecar_text(table.num_rows)
        registry = self.registry
        verified: list[Any] = []

        def verify(temp: Path) -> None:
            loaded = load_one(TableRef(self.table, temp), registry)
            if loaded.keyed is None:
                raise E.WrittenTableRejectedError(self.path, loaded.failures)
            if loaded.keyed.rows_read != table.num_rows:
                raise E.WriterError("the written table reads back with a different row count", file=self.path,
                                    values={"written": table.num_rows, "read": loaded.keyed.rows_read},
                                    fix="report this as a modperf bug")
            verified.append(loaded.keyed)

        staged = []
        try:
            staged.append(stage(self.path, parquet_writer(table), overwrite=self.overwrite, verify=verify,
                                follow_symlink=True))  # __post_init__ vetted: it resolves inside the root
            staged.append(stage(sidecar_path, text_writer(sidecar_text), overwrite=True))
            for s in staged:  # the table first: a sidecar never describes a table that is not there
                s.commit()
        finally:
            for s in staged:
                s.discard()
        self._closed = True
        keyed = verified[0]  # the bytes verified are the bytes that took the name (a rename)
        self.result = WriteResult(self.table, self.path, sidecar_path, keyed.rows_read, keyed.n_buckets,
                                  keyed.natives, keyed.models, time.perf_counter() - start)
        return self.result

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.discard()
        elif not self._closed:
            self.close()


def open_writer(
    table: str,
    *,
    root: str | os.PathLike[str],
    system: str,
    backend: str,
    version: str,
    model: str | None = None,
    tp_size: int | None = None,
    family_dir: str | None = None,
    status: str = "complete",
    collection: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    model_configs: Sequence[str | os.PathLike[str]] | None = None,
    **fixed: Any,
) -> TableWriter:
    """Open a writer for ``table`` under the data root ``root``.

    ``fixed`` holds every column that is the same for the whole collection (framework, device,
    op_name, kernel_source, dtypes...); ``tp_size`` may be fixed here or given per measurement.
    ``collection`` adds fields to the table's entry in ``collection_meta.yaml`` (collector_ref,
    image...). Raises at once for an unknown table or model, a path outside ``root``, an
    existing table (unless ``overwrite``) or a fixed value that is not a valid column value.
    """
    registry = ModelRegistry.default(model_configs)
    return TableWriter(table, Path(root), system, backend, version, model=model, tp_size=tp_size,
                       family_dir=family_dir, status=status, collection=dict(collection or {}),
                       overwrite=overwrite, registry=registry, fixed=dict(fixed))
