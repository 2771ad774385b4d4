"""The floors hold: import-linter's contracts (pyproject.toml) pass on the package and fail
on a wrong arrow, and no area imports another area's private ``_x`` module."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[3]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}  # the copy shadows the editable install
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("floors")
    shutil.copytree(
        ROOT / "pyflink_aisp", dest / "pyflink_aisp", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def test_the_package_keeps_every_layer_contract() -> None:
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # an area importing a floor above it (kafka is on floor 1, pipeline on floor 5)
        (
            "kafka/_limits.py",
            "from pyflink_aisp.pipeline import OPTIONS",
            "pyflink_aisp.kafka is not allowed to import",
        ),
        # the inference core importing a backend
        (
            "inference/_runtime.py",
            "from pyflink_aisp.inference.handlers import SentimentHandler",
            "pyflink_aisp.inference._runtime is not allowed to import pyflink_aisp.inference.handlers",
        ),
        # production code reaching for the dev stack
        (
            "pipeline/_plan.py",
            "from pyflink_aisp.local import LocalStack",
            "pyflink_aisp.pipeline is not allowed",
        ),
        # a circle inside one area, hidden in a function as the old cycle-dodging imports were
        (
            "local/_flink_config.py",
            "def _late():\n    from pyflink_aisp.local._stack import LocalStack\n    return LocalStack",
            "._flink_config -> ._stack",
        ),
    ],
)
def test_a_wrong_import_breaks_a_contract(tree_copy: Path, module: str, line: str, broken: str) -> None:
    path = tree_copy / "pyflink_aisp" / module
    original = path.read_text(encoding="utf-8")
    try:
        path.write_text(original + "\n\n" + line + "\n", encoding="utf-8")
        proc = _lint(tree_copy)
    finally:
        path.write_text(original, encoding="utf-8")
    assert proc.returncode != 0, proc.stdout
    assert broken in " ".join(proc.stdout.split()), proc.stdout  # import-linter wraps long lines


def private_imports_across_areas(graph: grimp.ImportGraph, package: str = "pyflink_aisp") -> list[str]:
    """``importer -> imported`` pairs where one area imports a private (``_x``) module of another.

    An area is the first name under ``package`` (``pyflink_aisp.kafka``); a module is private when
    a part of its name below its area starts with one underscore.
    """
    found = []
    for imported in sorted(graph.modules):
        parts = imported.split(".")
        if len(parts) < 3 or not any(p.startswith("_") and not p.startswith("__") for p in parts[2:]):
            continue
        for importer in sorted(graph.find_modules_that_directly_import(imported)):
            if importer.split(".")[:2] != parts[:2]:
                found.append(f"{importer} -> {imported}")
    return found


def test_no_area_imports_another_areas_private_module() -> None:
    assert private_imports_across_areas(grimp.build_graph("pyflink_aisp", cache_dir=None)) == []


def test_the_private_import_check_finds_one() -> None:
    graph = grimp.ImportGraph()
    for name in (
        "pyflink_aisp",
        "pyflink_aisp.kafka",
        "pyflink_aisp.kafka._decode",
        "pyflink_aisp.pipeline",
        "pyflink_aisp.pipeline._arrow_op",
        "pyflink_aisp.kafka._admin",
    ):
        graph.add_module(name)
    graph.add_import(importer="pyflink_aisp.pipeline._arrow_op", imported="pyflink_aisp.kafka._decode")
    graph.add_import(importer="pyflink_aisp.kafka._admin", imported="pyflink_aisp.kafka._decode")
    graph.add_import(importer="pyflink_aisp.pipeline._arrow_op", imported="pyflink_aisp.kafka")
    assert private_imports_across_areas(graph) == [
        "pyflink_aisp.pipeline._arrow_op -> pyflink_aisp.kafka._decode"
    ]
