"""Shared fixtures (helpers the tests import live in tests/helpers.py)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from tests.helpers import LEGACY_DIR, STALE_DIR, shared_fixtures, writable_copy

import modperf
from modperf.fast import cache_keys
from modperf.specs.models import ModelRegistry

# The suite never writes to the user's cache: every test (and every process a test starts, which
# inherits the environment) keeps its keyed-table cache in a folder of its own session.
_CACHE_DIR = tempfile.mkdtemp(prefix="modperf-test-cache-")
atexit.register(shutil.rmtree, _CACHE_DIR, True)
os.environ["MODPERF_CACHE_DIR"] = _CACHE_DIR
os.environ.pop("MODPERF_NO_CACHE", None)
# Human output is laid out for COLUMNS where it is set: a test that wants a width sets its own.
os.environ.pop("COLUMNS", None)


@pytest.fixture(scope="session")
def fixtures() -> Path:
    return shared_fixtures()


@pytest.fixture(scope="session")
def db() -> modperf.Database:
    """The embedded corpus, loaded lazily (one instance for the whole session). Its catalog is
    scanned now, while the cache folder is the session's (a test's own cache folder must not
    receive the session's scan record)."""
    database = modperf.open()
    assert database.catalog is not None
    return database


@pytest.fixture(scope="session")
def models() -> ModelRegistry:
    return ModelRegistry.default()


@pytest.fixture(scope="session")
def fixture_models(fixtures: Path) -> ModelRegistry:
    """Embedded configs plus the fixture HF configs (../shared/fixtures/09_hf_configs)."""
    return ModelRegistry.default([fixtures / "09_hf_configs"])


@pytest.fixture
def stale(fixtures: Path, tmp_path: Path) -> Path:
    return writable_copy(fixtures / STALE_DIR, tmp_path / "stale")


@pytest.fixture
def legacy(fixtures: Path, tmp_path: Path) -> Path:
    return writable_copy(fixtures / LEGACY_DIR, tmp_path / "legacy")


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder of the test's own (the persisted cache on, whatever the environment says)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(cache_keys.CACHE_DIR_ENV, str(folder))
    monkeypatch.delenv(cache_keys.NO_CACHE_ENV, raising=False)
    return folder
