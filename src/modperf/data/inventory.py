"""``modperf ls``: what a data root holds, without validating it."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from ..base import errors as E
from .catalog import Catalog, TableRef, sidecar_problems
from .families import family_of
from .families.base import HEADS, MODEL, TP
from .reader import read_row_count, read_schema, read_table


def _head_pairs(ref: TableRef) -> dict[str, Any]:
    """Row count, models and (num_heads x tp_size) pairs, reading only those columns."""
    try:
        names = set(read_schema(ref.path).names)
        rows = read_row_count(ref.path)
    except E.UnreadableTableError as exc:
        return {"rows": None, "error": str(exc)}
    info: dict[str, Any] = {"rows": rows, "models": [], "head_pairs": [], "has_num_heads": HEADS in names,
                            "has_tp_size": TP in names}
    if HEADS not in names:
        return info
    cols = [c for c in (MODEL, HEADS, TP) if c in names]
    try:
        table = read_table(ref.path, columns=cols)
    except E.UnreadableTableError as exc:
        return {"rows": rows, "error": str(exc)}
    heads = table.column(HEADS).to_numpy()
    tp = table.column(TP).to_numpy() if TP in names else np.zeros_like(heads)
    if MODEL in names:
        models = table.column(MODEL).to_pylist()
        per_model: dict[str, set[tuple[int, int]]] = defaultdict(set)
        for m, h, t in zip(models, heads.tolist(), tp.tolist()):
            # a model name is shown, not used: escaped and bounded (a hostile table's 1 MB name is not echoed)
            per_model[E.clean(str(m), E.MAX_VALUE_CHARS)].add((h, t))
        info["models"] = sorted(per_model)
        info["head_pairs_by_model"] = {m: [f"{h}x{t}" for h, t in sorted(v)] for m, v in sorted(per_model.items())}
        pairs = set().union(*per_model.values()) if per_model else set()
    else:
        pairs = set(zip(heads.tolist(), tp.tolist()))
    info["head_pairs"] = [f"{h}x{t}" if TP in names else f"{h}" for h, t in sorted(pairs)]
    return info


def list_tables(
    data_root: str | None = None,
    *,
    system: str | None = None,
    backend: str | None = None,
    version: str | None = None,
    table: str | None = None,
    problems: list[E.ModperfError] | None = None,
) -> list[dict[str, Any]]:
    """One entry per (system, backend, version, table) slot, with what answers it, plus any
    physical file that answers no slot (shadowed by a reuse declaration; a library table filed in
    a framework folder that is not served). The parts of the data root that could not
    be read or trusted (``Catalog.problems``) are added to ``problems`` when given."""
    catalog = Catalog.scan(data_root)
    catalog.refuse_unknown(system=system, backend=backend, version=version, table=table)
    slots = catalog.select(system=system, backend=backend, version=version, table=table, physical=False)
    if problems is not None:  # the same with and without --json: a malformed sidecar is listed either way
        problems.extend(catalog.problems)
        problems.extend(sidecar_problems((r.path.parent for r in slots), reuse=False))
    # files that answer no slot, listed beside the slots: those a reuse declaration shadows, and
    # library tables filed in a framework folder that are not served (their release's own file
    # answers, or other files claim it)
    unserved = [r for r in catalog.select(system=system, backend=backend, version=version, table=table)
                if r.shadowed or (r.misplaced is not None and r.misplaced.release is not None
                                  and r.misplaced.served_as is None)]
    out = []
    for ref in sorted([*slots, *unserved], key=lambda r: (r.system or "", r.backend or "", r.version or "",
                                                         r.table, r.shadowed)):
        fam = family_of(ref.table)
        out.append({**ref.to_dict(), "family": fam.name if fam else None,
                    "model_head_axis": fam is not None and fam.model_head_axis, **_head_pairs(ref)})
    return out
