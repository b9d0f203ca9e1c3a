"""Which tables a model's layers read: the GEMM table, the parts an MLA layer is composed from,
the dtype columns a user may set, and whether an MLA layer is composed (estimate and the step
pricer decide alike)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..data.families.base import Tier
from ..data.versions import choose_versions
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
    :func:`modperf.data.versions.choose_versions`): a version answers where every module table
    keyed by natives holds the model's ``native`` head count."""
    module_tables = [t for t in tables if t != GEMM_TABLE and table_tier(t) is not Tier.LOCAL]
    return choose_versions(
        f"{system}/{backend}", by_version, tables, version,
        lambda v: all(native in db.table(system, backend, v, t).natives for t in module_tables), notes,
        answering=f"holds a native-{native} bucket in every module table")


__all__ = ["COMPOSED_MLA_TABLES", "DTYPE_COLUMNS", "GEMM_TABLE", "composes", "table_tier", "versions_for_native"]
