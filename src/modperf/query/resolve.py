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
* the GEMM dtype the checkpoint's weights are stored in (:class:`modperf.specs.models.Quantization`),
  for the table's ``gemm_type`` / ``gemm_dtype`` column.

Each derived value carries the reason, so that a field the user gives that contradicts it is
refused with the field, the value given, the value derived and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..base import errors as E
from ..data.families.base import Family
from ..specs.layers import AttentionLayer, layer_schedule
from ..specs.models import ModelConfig
from ..specs.shard import local_heads, local_kv_heads

#: Key columns holding the dense linear layers' dtype.
GEMM_DTYPE_COLUMNS = ("gemm_type", "gemm_dtype")


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
    quant = cfg.quantization
    for column in GEMM_DTYPE_COLUMNS:
        if column in key_columns:
            if quant.gemm is not None:
                held = "it is served with" if cfg.served is not None else "its checkpoint stores"
                out.set(column, quant.gemm, f"{held} its linear layers as {quant.gemm} ({quant.source})")
            else:
                out.notes.append(f"{column} not derived: {quant.source}")
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


__all__ = ["GEMM_DTYPE_COLUMNS", "Derivation", "derive", "layer_kinds", "pick_layer"]
