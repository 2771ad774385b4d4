"""Shared fixtures for the model tests: one real asset build per session (~35 s on 2 cores)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyflink_aisp.models import ModelAssets, ensure_model_assets


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh cache directory holding one real build."""
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="session")
def built_assets(model_cache: Path) -> ModelAssets:
    """Real assets built by :func:`ensure_model_assets` into ``model_cache``."""
    return ensure_model_assets(model_cache)
