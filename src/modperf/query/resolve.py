"""From a model and a deployment to every table key the model, its checkpoint and its layer
schedule decide.

A query (or an estimate) that names a model and a tp size should not have to spell out what
the model already fixes. :func:`derive` reads it from the HF config, for one table:

* the layer kind that runs on this table (:mod:`modperf.specs.layers`): its native heads (MiMo's
  sliding layers have their own), and the key columns it fixes -- GQA kv heads, head_dim and
  window, DSA's ``op_name`` (shared-indexer layers run the ``*_skip_indexer`` rows),
  DeepSeek-V4's ``compress_ratio``. Where a model runs several kinds on one table (Gemma's
  sliding and full layers), the ``layer`` field picks one; without it the query says which
  kinds exist;
* the shard: rank-local heads ``native / tp`` and, in families keying kv heads, the rank-local
  kv heads by the backends' sharding rule (:func:`modperf.query.deployment.local_kv_heads`);
* the dtypes the weights are served in (:class:`modperf.specs.models.Quantization`), for the table's
  ``gemm_type`` / ``gemm_dtype`` (dense linear layers) and ``moe_dtype`` (routed experts)
  columns: the checkpoint's unless the deployment chose others.

Each derived value carries the reason. What the config fixes physically is refused when a field
the user gives contradicts it (the field, the value given, the value derived and why). A dtype
is the deployment's choice: :func:`serve` turns the dtypes a question gives into the served
model (:meth:`modperf.specs.models.ModelRegistry.served`), so the user's value wins and the reason says
what the checkpoint stores.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..base import errors as E
from ..data.families.base import Family
from ..specs.layers import AttentionLayer, layer_schedule
from ..specs.models import ModelConfig, ModelRegistry
from ..specs.shard import local_heads, local_kv_heads

#: Key columns whose value is a dtype the weights are served in, and which part of the served
#: dtypes (:class:`modperf.specs.models.Quantization`) each is: the checkpoint's by default, the
#: deployment's choice where given.
SERVED_COLUMNS = {"gemm_type": "gemm", "gemm_dtype": "gemm", "moe_dtype": "moe"}
#: What each part of the served dtypes quantizes, for the reasons answers give.
_WEIGHTS = {"gemm": "linear layers", "moe": "routed experts"}


@dataclass
class Derivation:
    """What a model at a tp size fixes for one table."""

    model: str
    native: int  # the native heads of the layer kind that runs on this table
    local: int | None  # rank-local heads (None without a tp size)
    layer: AttentionLayer | None  # the layer kind (None: the table is not in the model's schedule)
    fields: dict[str, Any] = field(default_factory=dict)  # key column -> derived value
    reasons: dict[str, str] = field(default_factory=dict)  # key column -> why
    notes: list[str] = field(default_factory=list)
    #: Derived columns that are the deployment's choice (dtypes), not the config's physics.
    choices: set[str] = field(default_factory=set)

    def set(self, name: str, value: Any, reason: str) -> None:
        self.fields[name] = value
        self.reasons[name] = reason


def layer_kinds(cfg: ModelConfig, table: str, phase: str) -> list[tuple[AttentionLayer, int]]:
    """The model's layer kinds that run on ``table`` in ``phase``, with their layer counts."""
    return [(layer, n) for layer, n in layer_schedule(cfg).groups() if layer.covered and layer.table(phase) == table]


def pick_layer(cfg: ModelConfig, table: str, phase: str, layer: str | None,
               given: Mapping[str, Any]) -> AttentionLayer | None:
    """The layer kind a query means: the one named, the only one, or the one the fields the
    user gave select; None when no layer of the model runs on this table (a kernel table)."""
    kinds = layer_kinds(cfg, table, phase)
    names = [f"{k.name} ({n} layers)" for k, n in kinds]
    if layer is not None:
        chosen = [k for k, _ in kinds if k.name == str(layer)]
        if not chosen:
            raise E.QueryFieldError(
                f"{cfg.model_id} runs no {layer!r} layers on {table}",
                values={"layer": layer, "model": cfg.model_id, "table": table},
                fix=f"layer kinds on {table}: {', '.join(names)}" if names else
                    f"no layer of {cfg.model_id} runs on {table}: leave layer out")
        return chosen[0]
    if not kinds:
        return None
    if len(kinds) == 1:
        return kinds[0][0]
    # the fields the user gave may pick one kind (window_size=0: the full layers)
    fitting = [k for k, _ in kinds
               if all(str(given[c]) == str(v) for c, v in k.fields_for(phase).items() if c in given)]
    if len(fitting) == 1:
        return fitting[0]
    raise E.QueryFieldError(
        f"{cfg.model_id} runs {len(kinds)} kinds of layer on {table}: {', '.join(names)}; give layer",
        values={"model": cfg.model_id, "table": table, "layers": [k.name for k, _ in kinds]},
        fix=f"add layer={kinds[0][0].name} (or --layer {kinds[0][0].name}); each kind is its own bucket")


def derive(cfg: ModelConfig, family: Family, table: str, phase: str, key_columns: set[str], *,
           tp: int | None, layer: str | None = None, given: Mapping[str, Any] | None = None) -> Derivation:
    """Every key column of ``table`` that ``cfg`` at tensor-parallel size ``tp`` fixes.
    ``key_columns`` are the columns the table keys (a derived value for a column the table does
    not key is left out); ``given`` are the user's fields (they may select a layer kind)."""
    given = given or {}
    chosen = pick_layer(cfg, table, phase, layer, given)
    native = chosen.native_heads if chosen is not None else cfg.native_heads
    model = cfg.model_id
    out = Derivation(model, native, None, chosen)
    if tp is not None:
        out.local = local_heads(native, tp)
    if chosen is not None:
        for name, value in chosen.fields_for(phase).items():
            if family.kv_heads_key is not None and name == family.kv_heads_key:
                continue
            out.set(name, value, f"its {chosen.name} layers use {name} {value}")
    kv_key = family.kv_heads_key
    if kv_key is not None and tp is not None:
        kv = int(chosen.fields_for(phase).get(kv_key, 0)) if chosen is not None else 0
        kv = kv or (cfg.kv_heads or native)
        out.set(kv_key, local_kv_heads(kv, tp),
                f"rank-local kv heads are {local_kv_heads(kv, tp)} ({kv} kv heads"
                + (f", each replicated on {tp // kv} ranks)" if tp > kv else f" / tp {tp})"))
    served = cfg.quantization
    for column, part in SERVED_COLUMNS.items():
        if column not in key_columns:
            continue
        value = getattr(served, part)
        if value is None:
            out.notes.append(f"{column} not derived: {served.source}")
            continue
        out.set(column, value, served_reason(cfg, column, given))
        out.choices.add(column)
    for name in [n for n in out.fields if n not in key_columns]:
        # a column this table does not key (an older file without window_size): only a value the
        # table's rows stand for (0: full attention) can be left out
        if name == "window_size" and out.fields[name]:
            raise E.NotCoveredError(
                f"{table} records no window_size column (its rows measured full attention); {model}'s "
                f"{chosen.name if chosen else ''} layers use a {out.fields[name]}-token window",
                values={"model": model, "window_size": out.fields[name]},
                fix="query a version whose table records window_size")
        del out.fields[name]
        out.reasons.pop(name, None)
    return out


def served_reason(cfg: ModelConfig, column: str, given: Mapping[str, Any]) -> str:
    """Why ``column`` (one of :data:`SERVED_COLUMNS`) holds the dtype ``cfg`` serves: the
    checkpoint's, or the deployment's choice (a field given, or a served variant's id) beside
    what the checkpoint stores."""
    part = SERVED_COLUMNS[column]
    weights = _WEIGHTS[part]
    value, own = getattr(cfg.quantization, part), cfg.checkpoint
    stored = getattr(own, part)
    if value == stored:
        return f"its checkpoint stores its {weights} as {value} ({own.source})"
    checkpoint = (f"its checkpoint stores them as {stored} ({own.source})" if stored is not None else
                  f"its checkpoint does not fix them ({own.source})")
    if given.get(column) is not None and str(given[column]) == value:
        return f"{value} as given (a deployment's choice); {checkpoint}"
    return f"served with its {weights} as {value} ({cfg.model_id}); {checkpoint}"


def served_note(cfg: ModelConfig) -> str | None:
    """A note saying which dtypes ``cfg`` serves other than its checkpoint's (None: none)."""
    served, own = cfg.quantization, cfg.checkpoint
    parts = [f"{_WEIGHTS[p]} as {getattr(served, p)} (its checkpoint: {getattr(own, p) or 'undecided'})"
             for p in ("gemm", "moe") if getattr(served, p) != getattr(own, p)]
    if not parts:
        return None
    return f"dtypes chosen: {cfg.base_id} served with its {' and its '.join(parts)}, as {cfg.model_id}"


def serve(registry: ModelRegistry, cfg: ModelConfig, chosen: Mapping[str, Any]) -> ModelConfig:
    """``cfg`` served with the dtypes ``chosen`` names in :data:`SERVED_COLUMNS` (a query's
    fields, estimate's dtype options): the deployment's choice wins over the checkpoint's. The
    dense layers' dtype given twice (``gemm_type`` and ``gemm_dtype``) must agree."""
    parts: dict[str, str] = {}
    named: dict[str, str] = {}
    for column, part in SERVED_COLUMNS.items():
        value = chosen.get(column)
        if value is None:
            continue
        if part in parts and parts[part] != str(value):
            raise E.UsageError(
                f"{named[part]}={parts[part]} and {column}={value} both name the dtype of {cfg.base_id}'s "
                f"{_WEIGHTS[part]}", values={named[part]: parts[part], column: value},
                fix=f"give one of {named[part]} and {column}")
        parts[part], named[part] = str(value), column
    if not parts:
        return cfg
    return registry.served(cfg, **parts)


__all__ = ["SERVED_COLUMNS", "Derivation", "derive", "layer_kinds", "pick_layer", "serve", "served_note",
           "served_reason"]
