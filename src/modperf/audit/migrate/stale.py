"""The stale-native pattern: inside one (model, version) group, ``num_heads`` equals the model's
native count on every row while ``tp_size`` varies. The group's rows get ``num_heads = native
// tp_size``; partly stale groups, constants that are not the native and natives that do not
divide are refused, and the whole file is left untouched."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from ...base import errors as E
from ...data.families.base import HEADS, MODEL, TP, Family, Tier
from ...data.validate import Categorical, stale_chain_rows
from ...specs.models import ModelRegistry
from .plan import (
    GROUP_RANK_LOCAL,
    GROUP_REFUSED,
    GROUP_STALE,
    RANK_LOCAL,
    REWRITE,
    STALE,
    FilePlan,
    GroupPlan,
    config_of,
    ints,
    sorted_unique,
    strings,
    usable_head_columns,
)

Classification = tuple[str, "str | None", "type[E.ModperfError] | None"]



def _rewrite_heads(plan: FilePlan, table: pa.Table, heads: np.ndarray, new_heads: np.ndarray) -> None:
    """The plan rewrites ``table``'s num_heads column to ``new_heads`` (its stored type kept)."""
    plan.source_table = table
    index = table.schema.get_field_index(HEADS)
    heads_field = table.schema.field(index)
    plan.migrated = table.set_column(index, heads_field, pa.array(new_heads, type=heads_field.type))
    plan.rows_changed = int((new_heads != heads).sum())
    plan.action = REWRITE

def _classify(heads: np.ndarray, tp: np.ndarray, native: int) -> Classification:
    """The state of one (model, version) group whose native is known."""
    tps, distinct_heads = np.unique(tp), np.unique(heads)
    if tps.size >= 2 and distinct_heads.size == 1 and int(distinct_heads[0]) == native:
        undivided = [int(t) for t in tps if native % int(t)]
        if undivided:
            return (GROUP_REFUSED, f"native {native} does not divide by tp_size {undivided}",
                    E.HeadsNotDivisibleError)
        return GROUP_STALE, None, None
    multi = tp > 1
    local_ok = heads * tp == native
    if not (multi & ~local_ok).any():
        return GROUP_RANK_LOCAL, None, None
    at_native = multi & (heads == native)
    if at_native.any() and ((multi & local_ok).any() or ((~multi) & (heads != native)).any()):
        return (GROUP_REFUSED, "partly stale: some rows hold the native count at tp>1, others are rank-local",
                E.PartlyStaleError)
    if distinct_heads.size == 1 and tps.size >= 2:
        return (GROUP_REFUSED, f"num_heads is constant ({int(distinct_heads[0])}) while tp_size varies, but is not "
                               f"the model's native {native}", E.MigrationRefusedError)
    if at_native.any():
        return (GROUP_REFUSED, "native count at a single tp_size > 1: the stale fingerprint needs tp_size to vary "
                               "within the group, so the rows cannot be told apart from mislabelled ones",
                E.MigrationRefusedError)
    return GROUP_REFUSED, "tp>1 rows that are neither rank-local nor the stale pattern", E.MigrationRefusedError


def _groups(table: pa.Table, forced_model: str | None) -> tuple[np.ndarray, list[tuple[str | None, str | None]]]:
    """Group id per row and (model, version) per group, in order of first appearance."""
    n = table.num_rows
    m_values: Sequence[str | None]  # [None] when the column is absent (and no model is forced)
    v_values: Sequence[str | None]
    if MODEL in table.column_names:
        m_codes, m_values = strings(table.column(MODEL))
    else:
        m_codes, m_values = np.zeros(n, dtype=np.int64), [forced_model]
    if "version" in table.column_names:
        v_codes, v_values = strings(table.column("version"))
    else:
        v_codes, v_values = np.zeros(n, dtype=np.int64), [None]
    combined = m_codes * (len(v_values) + 1) + v_codes
    _, first, group = np.unique(combined, return_index=True, return_inverse=True)
    # renumber groups by first appearance, so plans read in file order
    rank = np.argsort(np.argsort(first))
    group = rank[group.reshape(-1)]
    order = np.argsort(first)
    keys = []
    for g in order:
        row = int(first[g])
        keys.append((m_values[int(m_codes[row])], v_values[int(v_codes[row])]))
    return group, keys


def _refusal_errors(plan: FilePlan, refused: list[tuple[GroupPlan, type[E.ModperfError], np.ndarray]]) -> None:
    """One typed error per kind of refusal, each listing its groups and their rows."""
    by_kind: dict[type[E.ModperfError], list[tuple[GroupPlan, np.ndarray]]] = {}
    for group, cls, rows in refused:
        by_kind.setdefault(cls, []).append((group, rows))
    for cls, members in by_kind.items():
        gs = [g for g, _ in members]
        rows = np.sort(np.concatenate([r for _, r in members]))
        what_by_kind: dict[type[E.ModperfError], str] = {
            E.PartlyStaleError: "partly stale group(s)",
            E.HeadsNotDivisibleError: "group(s) whose native does not divide by tp_size"}
        what = what_by_kind.get(cls, "group(s) that show neither the stale pattern nor rank-local heads")
        plan.refuse(cls(
            f"{len(gs)} {what}; the file is left untouched (nothing is guessed)",
            file=plan.source, rows=rows[: E.ROWS_SHOWN].tolist(), row_count=int(rows.size),
            values={"groups": [g.brief() for g in gs]},
            fix="re-collect these groups with rank-local num_heads (native // tp_size), or split the file so that "
                "each group is either wholly stale or wholly rank-local, then migrate again",
        ))


def _stale_chains(table: pa.Table, family: Family, table_name: str) -> np.ndarray:
    """Rows of a model-less local-only table whose tp chains keep num_heads at the chain's native
    (:func:`modperf.data.validate.stale_chain_rows`: the loader's own rule)."""
    spec = family.spec(table_name)
    names = set(table.column_names)
    categorical = {}
    for name in spec.categorical:
        if name in names:
            codes, values = strings(table.column(name))
            categorical[name] = Categorical(codes.astype(np.int32), values)
    integers = {name: ints(table, name) for name in (*spec.discrete, *spec.axes, HEADS, TP) if name in names}
    return stale_chain_rows(spec, categorical, integers, table.num_rows)


def _plan_stale_chains(plan: FilePlan, table: pa.Table, family: Family) -> bool:
    """Plan the rewrite of the stale chains of a model-less local-only table, whose native
    convention stored each chain's native in num_heads; False where no chain is stale."""
    rows = _stale_chains(table, family, plan.table)
    if not rows.any():
        return False
    heads, tp = ints(table, HEADS), ints(table, TP)
    plan.pattern = STALE
    plan.groups = []
    for value in sorted_unique(heads[rows]):
        members = np.flatnonzero(rows & (heads == value))
        gt = tp[members]
        gp = GroupPlan(None, None, int(members.size), value, sorted_unique(gt), [value], GROUP_STALE,
                       reason=f"tp chains at native {value}: num_heads held at the native while tp_size varies")
        plan.groups.append(gp)
        undivided = [int(t) for t in np.unique(gt) if value % int(t)]
        if undivided:
            gp.status = GROUP_REFUSED
            plan.refuse(E.HeadsNotDivisibleError(
                f"stale chains at native {value} hold tp sizes {undivided} that do not divide it", file=plan.source,
                rows=members[: E.ROWS_SHOWN].tolist(), row_count=int(members.size),
                values={"native": value, "tp_sizes": undivided},
                fix="re-collect these chains with rank-local num_heads"))
            continue
        gp.num_heads_after = {int(t): value // int(t) for t in np.unique(gt)}
        gp.rows_changed = int((gt > 1).sum())
    plan.notes.append("no model column: each stale chain's native is the num_heads it holds constant (what the "
                      "native convention stored); the loader's per-chain rule found the chains")
    if not plan.ok:
        return True
    natives = np.where(rows, heads, -1)
    new_heads = np.where(rows, heads // np.where(rows, tp, 1), heads)
    plan.native_per_row = natives
    _rewrite_heads(plan, table, heads, new_heads)
    return True


def plan_stale(plan: FilePlan, table: pa.Table, registry: ModelRegistry, model: str | None,
               read_full: Callable[[], pa.Table], family: Family | None = None) -> None:
    """``table`` holds at least model, version, num_heads and tp_size; ``read_full`` reads the
    whole file once a rewrite is planned (or, for a model-less local-only table whose groups
    show no fingerprint, to look for stale tp chains of several natives)."""
    if not usable_head_columns(plan, table):
        return
    has_model = MODEL in table.column_names
    if model is not None and has_model:
        plan.notes.append("--model is not used: the table names each row's model")
    heads, tp = ints(table, HEADS), ints(table, TP)
    group, keys = _groups(table, None if has_model else model)
    row_lists = [np.flatnonzero(group == g) for g in range(len(keys))]
    native_per_row = np.full(table.num_rows, -1, dtype=np.int64)
    groups: list[GroupPlan] = []
    refused: list[tuple[GroupPlan, type[E.ModperfError], np.ndarray]] = []
    needs_model: list[GroupPlan] = []
    for (name, version), rows in zip(keys, row_lists):
        gh, gt = heads[rows], tp[rows]
        gp = GroupPlan(name, version, int(rows.size), None, sorted_unique(gt), sorted_unique(gh), GROUP_RANK_LOCAL)
        groups.append(gp)
        fingerprint = len(gp.tp_sizes) >= 2 and len(gp.num_heads_before) == 1
        if not has_model and not fingerprint:
            # a table without a model column records native as num_heads * tp_size per row (files
            # mix tp chains of several natives): without the fingerprint there is nothing to migrate
            continue
        if name is None:
            gp.status, gp.reason = GROUP_REFUSED, "stale fingerprint, but the table records no model"
            needs_model.append(gp)
            continue
        try:
            cfg = config_of(registry, name, plan.source, rows)
        except E.ModelError as exc:
            gp.status, gp.reason = GROUP_REFUSED, "model has no usable config"
            plan.refuse(exc)
            continue
        gp.native = cfg.native_heads
        native_per_row[rows] = gp.native
        gp.status, gp.reason, error = _classify(gh, gt, gp.native)
        if error is not None:
            refused.append((gp, error, rows))
        if gp.status == GROUP_STALE:
            gp.num_heads_after = {t: gp.native // t for t in gp.tp_sizes}
            gp.rows_changed = int((gh != gp.native // gt).sum())
    plan.groups = groups
    plan.native_per_row = native_per_row
    fingerprinted = any(g.status != GROUP_RANK_LOCAL for g in groups)
    if not has_model and not fingerprinted and family is not None and family.tier is Tier.LOCAL:
        try:
            full = read_full()
        except E.ModperfError as exc:
            plan.refuse(exc)
            return
        if _plan_stale_chains(plan, full, family):
            return
    if needs_model:
        plan.refuse(E.ModelRequiredError(
            "num_heads is constant while tp_size varies (the stale fingerprint), and the table has no model column "
            "to take the native head count from", file=plan.source,
            values={"groups": [g.brief() for g in needs_model]},
            fix=f"run `modperf migrate {plan.source} --model MODEL_ID` with the model whose native head count the "
                "constant num_heads is",
        ))
    if refused:
        _refusal_errors(plan, refused)
    stale = [g for g in groups if g.status == GROUP_STALE]
    if stale or refused or needs_model:
        plan.pattern = STALE
    elif plan.ok:
        plan.pattern = RANK_LOCAL
    if not plan.ok or not stale:
        return
    new_heads = heads.copy()
    for g, rows in zip(groups, row_lists):
        if g.status == GROUP_STALE:
            new_heads[rows] = g.native // tp[rows]
    try:
        table = read_full()
    except E.ModperfError as exc:
        plan.refuse(exc)
        return
    _rewrite_heads(plan, table, heads, new_heads)
