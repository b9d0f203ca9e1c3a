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
from pathlib import Path

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
