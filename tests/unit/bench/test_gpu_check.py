"""bench/gpu_check.sh in CI: the bundle for the GPU host and the CPU dry run of the check (issue 23).

The bundle is built from the quick test assets (real MiniLM encoder, a random head) with a 16-review
reference; the dry run (``--cpu-only``: 64 rows, batch 16/32, fp32 and bf16 on the CPU) then runs
every phase through the same script a lent GPU host runs, behind the import guard.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pyflink_aisp.models import ModelAssets

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
MIB = 2**20
SAMPLE = 16


def _script(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``bash bench/gpu_check.sh ARGS`` with this interpreter."""
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHON": sys.executable},
    )


@pytest.fixture(scope="module")
def bundle(quick_assets: ModelAssets, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("gpu-check") / "bundle"
    proc = _script(
        "bundle",
        "--out",
        str(out),
        "--assets",
        str(quick_assets.directory),
        "--sample",
        str(SAMPLE),
        "--rounding-rows",
        "8",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc.stdout


@pytest.fixture(scope="module")
def dry_run(
    bundle: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], str, str]:
    out = tmp_path_factory.mktemp("gpu-check-out")
    proc = _script("run", "--bundle", str(bundle[0]), "--out", str(out), "--cpu-only")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = json.loads((out / "gpu_check.json").read_text(encoding="utf-8"))
    return results, (out / "gpu_check.md").read_text(encoding="utf-8"), proc.stdout


def _status(results: dict[str, Any], starts: str) -> str:
    rows = [r for r in results["acceptance"] if r["line"].startswith(starts)]
    assert len(rows) == 1, (starts, [r["line"] for r in results["acceptance"]])
    return rows[0]["status"]


def test_the_bundle_fits_the_gpu_host_and_its_size_is_printed(bundle: tuple[Path, str]) -> None:
    directory, stdout = bundle
    manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    on_disk = {
        str(p.relative_to(directory)): p.stat().st_size
        for p in directory.rglob("*")
        if p.is_file() and p.name != "manifest.json"
    }
    assert on_disk == {name: entry["bytes"] for name, entry in manifest["files"].items()}
    assert manifest["total_bytes"] == sum(on_disk.values())
    printed = re.search(r"full bundle \(2,048-review reference\): ([\d,]+) bytes", stdout)
    assert printed is not None, stdout
    full = int(printed.group(1).replace(",", ""))
    assert full == manifest["full_total_bytes"]
    assert 40 * MIB < full <= 60 * MIB  # the float16 weights alone are ~43 MiB
    assert manifest["texts"]["rows"] == 51_232 and manifest["reference"]["rows"] == SAMPLE


def test_the_bundle_weights_are_float16_and_reproduce_the_handler(bundle: tuple[Path, str]) -> None:
    directory, _ = bundle
    raw = (directory / "weights" / "model.safetensors").read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__" and "position_ids" not in k}
    assert dtypes == {"F16"}
    reference = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))["reference"]
    assert reference["handler_check"]["rows"] == SAMPLE
    assert reference["handler_check"]["max_abs_diff"] <= 1e-5


def test_the_cpu_dry_run_passes_every_row_it_can_show(dry_run: tuple[dict[str, Any], str, str]) -> None:
    results, _, _ = dry_run
    assert results["mode"] == "cpu-only" and results["finished"] is True
    assert results["import_guard"]["refused"] == []
    assert _status(results, "PyFlink-free") == "pass"
    assert _status(results, "Bundle for the GPU host") == "pass"
    assert _status(results, "fp32 on the device") == "pass"
    assert _status(results, "Every throughput pass") == "pass"
    assert _status(results, "bf16 vs fp32") == "pass"
    assert _status(results, "check_lease_device") == "pass"
    assert _status(results, "Every phase finished") == "pass"
    # never CPU numbers in a GPU row
    assert (
        _status(results, "GPU fp32") == "not applicable" and _status(results, "GPU bf16") == "not applicable"
    )
    assert _status(results, "Forced OOM") == "not applicable"
    assert _status(results, "On the device") == "not applicable"
    assert _status(results, "ONNX Runtime CUDA") == "not measured"


def test_the_dry_run_measures_every_path_precision_and_batch(
    dry_run: tuple[dict[str, Any], str, str],
) -> None:
    results, markdown, _ = dry_run
    rows = results["phases"]["throughput"]["rows"]
    cells = {(r["path"], r["precision"], r["batch"]) for r in rows}
    assert cells == {
        (p, q, b) for p in ("plain", "handler", "runtime") for q in ("fp32", "bf16") for b in (16, 32)
    }
    for r in rows:
        assert r["status"] == "ok" and r["device"] == "cpu" and r["rows"] == 64
        assert r["sentences_per_s"] > 0 and r["gpu_busy_pct"] is None
        assert r["ref_rows_compared"] >= 1
        if r["path"] != "plain":  # every row checked against the plain loop, same precision and batch
            assert r["plain_rows_compared"] == 64
            assert r["plain_max_abs_diff"] <= (1e-4 if r["precision"] == "fp32" else 2e-2)
        if r["path"] != "plain":  # the dry run drives the pipelined (CUDA-style) path
            assert r["pipeline_depth"] == 2
    assert "sentences/s (CPU)" in markdown and "| not measured |" in markdown
    bf16 = results["phases"]["bf16"]
    assert bf16["rows_compared"] == bf16["rows_planned"] == 64
    assert results["phases"]["reference"]["rows_compared"] == SAMPLE
    assert results["phases"]["reference"]["max_abs_diff"] <= 1e-4


def test_a_run_cut_short_still_reports_what_ran(bundle: tuple[Path, str], tmp_path: Path) -> None:
    proc = _script(
        "run", "--bundle", str(bundle[0]), "--out", str(tmp_path), "--cpu-only", "--deadline-s", "0"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "gpu_check.json").read_text(encoding="utf-8"))
    assert results["phases"]["environment"]["status"] == "ok"
    assert results["phases"]["reference"]["rows_compared"] == 0
    assert {r["status"] for r in results["phases"]["throughput"]["rows"]} == {"skipped (deadline)"}
    assert _status(results, "Every phase finished") == "fail"
    assert "| fail |" in (tmp_path / "gpu_check.md").read_text(encoding="utf-8")


def test_the_import_guard_refuses_what_the_gpu_host_lacks() -> None:
    code = """
import sys
sys.path.insert(0, "bench")
from _gpu_guard import install
guard = install()
for name in ("pyflink_aisp.pipeline", "pyflink_aisp.kafka", "pyflink_aisp.affinity._client"):
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"{name} was not refused")
project = {"__name__": "pyflink_aisp.inference.fake"}
try:
    exec("import fastapi", project)
except ImportError:
    pass
else:
    raise SystemExit("fastapi imported by project code was not refused")
third_party = {"__name__": "somelib"}
try:
    exec("import fastapi", third_party)
except ImportError as exc:
    if "guard" in str(exc):
        raise SystemExit("a third-party import was refused")
import pyflink_aisp.inference.handlers, pyflink_aisp.tokenize, pyflink_aisp.affinity
print("\\n".join(guard.refused))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    refused = proc.stdout.splitlines()
    assert [line.split(" ")[0] for line in refused] == [
        "pyflink_aisp.pipeline",
        "pyflink_aisp.kafka",
        "pyflink_aisp.affinity._client",
        "fastapi",
    ]
    assert "imported by pyflink_aisp.inference.fake" in refused[-1]


def _report_module() -> Any:
    sys.path.insert(0, str(ROOT / "bench"))
    import _gpu_report

    return _gpu_report


def _gpu_results(rates: dict[tuple[str, int], float], mode: str = "gpu") -> dict[str, Any]:
    rows = [
        {
            "path": p,
            "precision": q,
            "batch": b,
            "device": "cuda:0",
            "status": "ok",
            "rows": 100,
            "sentences_per_s": rate,
            "gpu_busy_pct": 90.0,
            "ref_rows_compared": 4,
            "ref_max_abs_diff": 1e-6,
            "plain_rows_compared": 100,
            "plain_max_abs_diff": 1e-6,
        }
        for (p, b), rate in rates.items()
        for q in ("fp32", "bf16")
    ]
    phase = {"status": "ok", "rows": rows, "texts": 100, "warmup_texts": 10, "arrow_batch": 8192}
    return {
        "mode": mode,
        "device": "cuda:0",
        "started": "-",
        "command": "-",
        "finished": False,
        "phases": {"throughput": phase},
        "import_guard": {"refused": []},
    }


def test_gpu_rows_hold_the_handler_and_runtime_to_the_plain_loop(tmp_path: Path) -> None:
    report = _report_module()
    fast = {
        ("plain", 256): 30_000.0,
        ("handler", 256): 27_000.0,
        ("runtime", 256): 25_000.0,
        ("plain", 1024): 48_000.0,
        ("handler", 1024): 45_000.0,
        ("runtime", 1024): 40_000.0,
    }
    assert _status(_acceptance_of(report, fast), "GPU fp32") == "pass"
    slow = fast | {("runtime", 1024): 20_000.0}  # 0.42x the plain loop
    assert _status(_acceptance_of(report, slow), "GPU bf16") == "fail"
    # the same numbers from a CPU dry run never fill a GPU row
    assert _status(_acceptance_of(report, fast, "cpu-only"), "GPU fp32") == "not applicable"
    # written mid-run: phases not run yet are pending, not passed
    results = _acceptance_of(report, fast)
    assert _status(results, "bf16 vs fp32") == "pending"
    assert _status(results, "Every phase finished") == "pending"
    report.write_results(results, tmp_path)
    assert "| pending |" in (tmp_path / "gpu_check.md").read_text(encoding="utf-8")


def _acceptance_of(report: Any, rates: dict[tuple[str, int], float], mode: str = "gpu") -> dict[str, Any]:
    results = _gpu_results(rates, mode)
    results["acceptance"] = report.acceptance(results)
    return results
