"""Shared by the bench tests: import a module of ``bench/`` (scripts, not a package) by name."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"


def import_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` as a module (``bench/`` on ``sys.path`` only while it imports)."""
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="session")
def bench_module() -> Callable[[str], ModuleType]:
    """:func:`import_bench`."""
    return import_bench
