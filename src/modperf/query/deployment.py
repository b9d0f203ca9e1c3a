"""Whether a table can answer a deployment (the shard itself is :mod:`modperf.specs.shard`).

Query and coverage both ask here, so that they cannot disagree:

* whether a table's heads axis answers a local count (:func:`heads_answer`): measured,
  interpolated between measured locals, extrapolated within the query limit, or not at all --
  the rule a query's grid applies, so coverage reports what a query answers;
* the module geometry check (:func:`geometry_mismatch`) and native substitution
  (:func:`nearest_native`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..base import errors as E
from .interp import EXTRAPOLATION_LIMIT

if TYPE_CHECKING:
    from ..data.buckets import KeyedTable
    from ..specs.models import ModelConfig

MEASURED, INTERPOLATED, EXTRAPOLATED = "exact", "interpolated", "extrapolated"


def heads_answer(measured_locals: Sequence[int], local: int) -> str | None:
    """How a heads axis holding ``measured_locals`` answers ``local``: measured (``exact``),
    bracketed (``interpolated``), within the extrapolation limit past the nearest end
    (``extrapolated``), or None. A local-only table answers any native's local this way; a
    [native][local] table answers from its native's locals only."""
    if not measured_locals:
        return None
    values = sorted(set(int(v) for v in measured_locals))
    if local in values:
        return MEASURED
    if values[0] < local < values[-1]:
        return INTERPOLATED
    edge = values[0] if local < values[0] else values[-1]
    if abs(math.log2(local + 1.0) - math.log2(edge + 1.0)) <= EXTRAPOLATION_LIMIT:
        return EXTRAPOLATED
    return None


# --- natives ----------------------------------------------------------------------------------


def nearest_native(natives: Iterable[int], native: int | None) -> int:
    """Nearest native by ratio; ties go to the larger (more work: the conservative answer)."""
    target = float(native or 1)
    return min(natives, key=lambda n: (abs(math.log(n / target)), -n))


def geometry_mismatch(keyed: KeyedTable, config: ModelConfig, models: Sequence[str]) -> dict[str, Any]:
    """Fields of the family's module geometry where ``config`` differs from the model that
    measured a bucket (empty: the same module)."""
    fields = keyed.family.geometry_for(keyed.ref.table)
    try:
        mine = dict(config.geometry(fields))
    except E.ModelError:
        return {"config": "cannot read the fields this family needs"}
    theirs = dict(keyed.model_geometry.get(models[0], ())) if models else {}
    if not theirs:
        return {}
    return {k: {"query": mine.get(k), "bucket": v} for k, v in theirs.items() if mine.get(k) != v}


__all__ = ["EXTRAPOLATED", "EXTRAPOLATION_LIMIT", "INTERPOLATED", "MEASURED", "geometry_mismatch", "heads_answer",
           "nearest_native"]
