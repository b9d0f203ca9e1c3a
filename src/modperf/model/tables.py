"""Which tables a model's layers read: the GEMM table, the parts an MLA layer is composed from,
the dtype columns a user may set, and whether an MLA layer is composed (estimate and the step
pricer decide alike)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..base import errors as E
from ..data.families.base import DTYPE_KEYS, Tier
from ..data.versions import choose_versions, refuse_unknown
from ..query.resolve import SERVED_COLUMNS
from ..specs.layers import AttentionLayer

if TYPE_CHECKING:
    from ..query.db import Database

GEMM_TABLE = "gemm"
#: Dtype key columns a user may set (``dtypes``); unset ones follow the checkpoint where it fixes
#: them (the GEMM dtype) and otherwise the query's documented default (bfloat16 where measured).
DTYPE_COLUMNS = ("attn_dtype", "kv_cache_dtype", "mla_dtype", "gemm_type", "gemm_dtype", "bmm_dtype")
#: The tables an MLA layer is composed from where no MLA module table exists.
COMPOSED_MLA_TABLES = ("context_mla", "generation_mla", "mla_bmm", GEMM_TABLE)


def composes(layer: AttentionLayer, by_version: Mapping[str, set[str]], version: str | None, mla: str) -> bool:
    """An MLA layer is composed where no considered version holds its module tables but one holds
    the kernel, bmm and GEMM tables (``mla="auto"``), or always (``"composed"``, to compare the
    two where both exist), or never (``"module"``)."""
    if layer.family != "mla_module" or mla == "module":
        return False
    considered = [version] if version is not None else list(by_version)
    if mla == "composed":
        return True
    module = {t for t in (layer.context_table, layer.generation_table) if t}
    if any(module <= by_version.get(v, set()) for v in considered):
        return False
    return any(set(COMPOSED_MLA_TABLES) <= by_version.get(v, set()) for v in considered)



def table_tier(table: str) -> Tier:
    from ..data.families import family_of

    fam = family_of(table)
    assert fam is not None  # tables come from layer schedules and COMPOSED_MLA_TABLES, all declared
    return fam.tier


def versions_for_native(db: Database, system: str, backend: str, by_version: Mapping[str, set[str]],
                        tables: Sequence[str], version: str | None, native: int, notes: list[str]) -> dict[str, str]:
    """The version of each of a model's attention ``tables`` (the version policy,
    :func:`modperf.data.versions.choose_versions`): a module table keyed by natives answers
    where it holds the model's ``native`` head count."""
    module_tables = {t for t in tables if t != GEMM_TABLE and table_tier(t) is not Tier.LOCAL}
    return choose_versions(
        f"{system}/{backend}", by_version, tables, version,
        lambda t, v: t not in module_tables or native in db.table(system, backend, v, t).natives, notes,
        answering=f"holds a native-{native} bucket in every module table")



def check_version(db: Database, system: str, backend: str, version: str | None) -> None:
    """A version the user named that ``system``/``backend`` does not hold at all is refused,
    naming the versions it holds (the version policy, :mod:`modperf.data.versions`; a system and
    backend the root holds nothing of is an UnknownTableError naming what it holds)."""
    if version is not None:
        held = db.catalog.tables_by_version(system, backend)
        if version not in held:
            raise refuse_unknown(f"{system}/{backend}", version, held)


def refuse_unpriced_dtypes(db: Database, system: str, backend: str, versions: Mapping[str, str],
                           chosen: Mapping[str, str]) -> None:
    """Nothing silently ignored: a dtype chosen for a key column that no table of the estimate
    (``versions``: table -> version) keys is refused. The dense layers' and the experts' dtypes
    name the dtype the weights are served in (modperf.query.resolve.SERVED_COLUMNS): any column of the
    same part counts."""
    if not chosen:
        return
    keyed: dict[str, set[str]] = {}
    for t, v in versions.items():
        try:
            keyed[t] = set(db.table(system, backend, v, t).key_names)
        except E.ModperfError:
            continue  # a table that does not load prices nothing (its ops say why)
    for column, value in chosen.items():
        part = SERVED_COLUMNS.get(column)
        columns = {c for c, p in SERVED_COLUMNS.items() if p == part} if part else {column}
        if not any(columns & keys for keys in keyed.values()):
            dtypes = sorted({c for keys in keyed.values() for c in keys if c in DTYPE_KEYS})
            raise E.OptionValueError(
                f"{column}={value}: no table this estimate prices ({', '.join(sorted(keyed))}) keys "
                f"{' or '.join(sorted(columns))}, so the choice would change nothing",
                values={"option": column, "value": value, "tables": sorted(keyed)},
                fix=f"drop --{column.replace('_', '-')}; the dtypes these tables key: {', '.join(dtypes) or 'none'}")

__all__ = ["COMPOSED_MLA_TABLES", "DTYPE_COLUMNS", "GEMM_TABLE", "check_version", "composes", "refuse_unpriced_dtypes",
           "table_tier", "versions_for_native"]
