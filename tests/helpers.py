"""Helpers the tests share (import them from here, never from conftest).

Real-data tests read the embedded corpus (the installed aiconfigurator-core wheel) and the
historical fixtures in ``../shared/fixtures`` beside the checkout. A fresh clone has no
``../shared``: those tests skip with the reason, unless MODPERF_REQUIRE_SHARED=1 (set by
``.ci/run``) turns the absence into a failure.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
FIXTURES = SHARED / "fixtures"
REQUIRE_SHARED = os.environ.get("MODPERF_REQUIRE_SHARED") == "1"

# migration fixtures (test_migrate, cli/test_migrate_cmd)
STALE_DIR = "01_dsv4_stale_vs_migrated/stale_parent_eed87c1c9"
TWIN_DIR = "01_dsv4_stale_vs_migrated/migrated_93dfd1fd2"
LEGACY_DIR = "03_legacy_no_num_heads/aiconfigurator-0.1.0_h200_sxm_trtllm_0.20.0"
CSA_CTX = "b200_sxm/sparse_attention/sglang/0.5.10/dsv4_csa_context_module_perf.parquet"


def shared_fixtures() -> Path:
    """The fixtures folder, or skip (fail under MODPERF_REQUIRE_SHARED=1) when it is absent."""
    if not (FIXTURES / "README.md").is_file():
        message = f"../shared/fixtures not found at {FIXTURES} (only CI and dev machines have it beside the checkout)"
        if REQUIRE_SHARED:
            pytest.fail(message + "; MODPERF_REQUIRE_SHARED=1 makes this a failure")
        pytest.skip(message)
    return FIXTURES


def writable_copy(src: Path, dst: Path) -> Path:
    """The fixtures are read-only; copies must be writable for migrate to replace files."""
    shutil.copytree(src, dst, copy_function=shutil.copyfile)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return dst


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- real tables, read or rewritten ----------------------------------------------------------


def variant(db: Any, tmp_path: Path, slot: tuple[str, str, str, str], mutate: Callable[[pa.Table], pa.Table]) -> Any:
    """A mutated copy of a real table, written in the standard layout under tmp_path."""
    from modperf.catalog import refs_for_paths

    ref = db.ref(*slot)
    table = mutate(pq.read_table(ref.path))
    out = tmp_path / ref.system / ref.family_dir / ref.backend / ref.version / ref.path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    return refs_for_paths([out])[0]


def set_col(table: pa.Table, name: str, values: Any) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, name, pa.array(values) if not isinstance(values, pa.Array) else values)


def patched(table: pa.Table, name: str, rows: dict[int, object]) -> pa.Table:
    values = table.column(name).to_pylist()
    for r, v in rows.items():
        values[r] = v
    return set_col(table, name, pa.array(values, type=table.schema.field(name).type))


def stored_rows(path: Path, where: Mapping[str, Any]) -> pa.Table:
    """The rows of a table file whose columns equal ``where``, read with pyarrow alone."""
    table = pq.read_table(path)
    mask = None
    for col, value in where.items():
        m = pc.equal(table.column(col), value)
        mask = m if mask is None else pc.and_(mask, m)
    return table.filter(mask) if mask is not None else table


def stored_latency(path: Path, where: Mapping[str, Any], column: str = "latency") -> float:
    """The latency the file stores at ``where``: the lower median where rows repeat the key
    (the loader's duplicate rule), the value itself where they do not."""
    values = sorted(stored_rows(path, where).column(column).to_pylist())
    assert values, f"no stored row at {dict(where)}"
    return values[(len(values) - 1) // 2]


def column(table: pa.Table, name: str) -> np.ndarray:
    return np.asarray(table.column(name).to_pylist())
