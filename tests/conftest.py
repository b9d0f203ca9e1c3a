"""Shared test fixtures.

Real-data tests read the embedded corpus (the installed aiconfigurator-core wheel) and the
historical fixtures in ``../shared/fixtures`` beside the checkout. A fresh clone has no
``../shared``: those tests skip with the reason, unless MODPERF_REQUIRE_SHARED=1 (set by
``.ci/run``) turns the absence into a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import modperf
from modperf.models import ModelRegistry

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
FIXTURES = SHARED / "fixtures"
REQUIRE_SHARED = os.environ.get("MODPERF_REQUIRE_SHARED") == "1"


def shared_fixtures() -> Path:
    """The fixtures folder, or skip (fail under MODPERF_REQUIRE_SHARED=1) when it is absent."""
    if not (FIXTURES / "README.md").is_file():
        message = f"../shared/fixtures not found at {FIXTURES} (only CI and dev machines have it beside the checkout)"
        if REQUIRE_SHARED:
            pytest.fail(message + "; MODPERF_REQUIRE_SHARED=1 makes this a failure")
        pytest.skip(message)
    return FIXTURES


@pytest.fixture(scope="session")
def fixtures() -> Path:
    return shared_fixtures()


@pytest.fixture(scope="session")
def db() -> modperf.Database:
    """The embedded corpus, loaded lazily (one instance for the whole session)."""
    return modperf.open()


@pytest.fixture(scope="session")
def models() -> ModelRegistry:
    return ModelRegistry.default()


@pytest.fixture(scope="session")
def fixture_models(fixtures: Path) -> ModelRegistry:
    """Embedded configs plus the fixture HF configs (../shared/fixtures/09_hf_configs)."""
    return ModelRegistry.default([fixtures / "09_hf_configs"])
