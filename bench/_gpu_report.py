"""The GPU check's results: ``gpu_check.json`` and ``gpu_check.md``, rewritten after every phase.

The markdown opens with the pass/fail table, one row per acceptance line of issue 23 that a GPU run
can show; a row reads ``pass``, ``fail``, ``not applicable`` (a CPU dry run: no GPU number is ever
taken from CPU numbers), ``not measured`` (with the reason) or ``pending`` (its phase has not run yet:
a run cut short still reports what it did).

Thresholds: the handler and the runtime must reach :data:`RATIO_FLOOR` of the plain loop's sentences/s
at batch 256 and 1,024 in each precision (the issue's goal: the job's path at the speed of a plain
PyTorch loop doing the same work, tokenization included); float32 must match the CPU reference within
:data:`~_gpu_context.FP32_TOLERANCE`; bf16 must stay within the handler's precision tolerance of
float32 with at most :data:`~_gpu_phases.BF16_FLIP_LIMIT` of the labels flipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _gpu_context import FP32_TOLERANCE
from _gpu_phases import BF16_FLIP_LIMIT

__all__ = ["PHASES", "RATIO_FLOOR", "acceptance", "render", "write_results"]

#: Phase keys in report order, with their titles.
PHASES = {
    "environment": "a. Environment",
    "reference": "b. CPU reference agreement",
    "throughput": "c. Throughput",
    "bf16": "d. bf16 agreement with fp32",
    "oom": "e. Forced out-of-memory recovery",
    "lease": "f. Lease UUID check",
    "ort": "g. ONNX Runtime on CUDA",
}
#: Least share of the plain loop's sentences/s the handler and the runtime must reach on the GPU.
RATIO_FLOOR = 0.8
_RATIO_BATCHES = (256, 1024)
#: Phase statuses of a phase cut short by its deadline or broken by an error.
_CUT = ("partial", "error", "skipped")
_NA_CPU = "not applicable", "CPU dry run: CPU numbers are never GPU numbers"


def _row(line: str, status: str, evidence: str) -> dict[str, str]:
    return {"line": line, "status": status, "evidence": evidence}


def _phase(results: dict[str, Any], key: str) -> dict[str, Any] | None:
    return results["phases"].get(key)


def _guard(results: dict[str, Any]) -> dict[str, str]:
    refused = results["import_guard"]["refused"]
    return _row(
        "PyFlink-free: no pyflink, confluent_kafka, httpx, fastapi or PyFlink-side area loaded",
        "fail" if refused else "pass",
        "; ".join(refused) or "import guard refused nothing",
    )


def _bundle(results: dict[str, Any]) -> dict[str, str]:
    env = _phase(results, "environment")
    line = "Bundle for the GPU host ≤ 60 MiB, every file's sha256 checked"
    if env is None or "bundle" not in env:
        return _row(line, "pending", "environment phase not run")
    b, mib = env["bundle"], 2**20
    ok = max(b["total_bytes"], b["full_total_bytes"]) <= b["limit_bytes"]
    return _row(
        line,
        "pass" if ok else "fail",
        f"{b['total_bytes'] / mib:.1f} MiB here, "
        f"{b['full_total_bytes'] / mib:.1f} MiB with the 2,048-review reference",
    )


def _reference(results: dict[str, Any]) -> dict[str, str]:
    ph = _phase(results, "reference")
    line = f"fp32 on the device = bundled CPU reference (|Δ| ≤ {FP32_TOLERANCE:g}, no label flips, every row)"
    if ph is None:
        return _row(line, "pending", "phase b not run")
    if ph["status"] not in ("ok", "partial (deadline)"):
        return _row(line, "fail", ph["status"])
    ok = (
        ph["rows_compared"] == ph["rows_planned"]
        and ph["max_abs_diff"] is not None
        and ph["max_abs_diff"] <= FP32_TOLERANCE
        and ph["label_flips"] == 0
    )
    return _row(
        line,
        "pass" if ok else "fail",
        f"{ph['device']}: {ph['rows_compared']}/{ph['rows_planned']} rows, "
        f"max |Δ| {_num(ph['max_abs_diff'])}, {ph['label_flips']} label flips",
    )


def _cells(results: dict[str, Any]) -> list[dict[str, Any]]:
    ph = _phase(results, "throughput")
    return [] if ph is None else ph["rows"]


def _ratios(results: dict[str, Any], precision: str) -> dict[str, str]:
    line = (
        f"GPU {precision}: handler and runtime ≥ {RATIO_FLOOR:.0%} of the plain loop's sentences/s "
        "at batch 256 and 1,024"
    )
    if results["mode"] != "gpu":
        return _row(line, *_NA_CPU)
    rate = {
        (c["path"], c["batch"]): c.get("sentences_per_s")
        for c in _cells(results)
        if c["precision"] == precision
    }
    if not rate:
        return _row(line, "pending", "phase c not run")
    parts, ok = [], True
    for batch in _RATIO_BATCHES:
        plain = rate.get(("plain", batch))
        for path in ("handler", "runtime"):
            got = rate.get((path, batch))
            if not plain or not got:
                ok = False
                parts.append(f"b{batch} {path}: no rate")
                continue
            ok = ok and got / plain >= RATIO_FLOOR
            parts.append(f"b{batch} {path} {got:,.0f}/s = {got / plain:.2f}x plain")
    return _row(line, "pass" if ok else "fail", "; ".join(parts))


def _verified(results: dict[str, Any]) -> dict[str, str]:
    from pyflink_aisp.inference.handlers._torch import PRECISION_TOLERANCE

    line = (
        "Every throughput pass scored right: within tolerance of the CPU reference (rows that have one) "
        "and, handler and runtime, of the plain loop on every row"
    )
    cells = [c for c in _cells(results) if c["status"] == "ok"]
    if not cells:
        return _row(line, "pending" if _phase(results, "throughput") is None else "fail", "no complete pass")

    def off(c: dict[str, Any]) -> bool:
        tol = FP32_TOLERANCE if c["precision"] == "fp32" else PRECISION_TOLERANCE
        if not c["ref_rows_compared"] or c["ref_max_abs_diff"] > tol:
            return True
        return c["path"] != "plain" and (
            c.get("plain_rows_compared") != c["rows"] or c["plain_max_abs_diff"] > tol
        )

    bad = [f"{c['path']}/{c['precision']}/b{c['batch']}" for c in cells if off(c)]
    fp32 = [c for c in cells if c["precision"] == "fp32" and c["path"] != "plain"]
    worst = max((c.get("plain_max_abs_diff") or 0.0 for c in fp32), default=None)
    return _row(
        line,
        "fail" if bad else "pass",
        f"{len(cells)} passes; fp32 handler/runtime vs plain max |Δ| "
        f"{_num(worst)}" + (f"; off: {', '.join(bad)}" if bad else ""),
    )


def _bf16(results: dict[str, Any]) -> dict[str, str]:
    ph = _phase(results, "bf16")
    line = (
        f"bf16 vs fp32 on every corpus row: |Δ| within the handler's tolerance, label flips ≤ "
        f"{BF16_FLIP_LIMIT:.1%} of the rows (at least 1 allowed)"
    )
    if ph is None:
        return _row(line, "pending", "phase d not run")
    if ph["status"] not in ("ok", "partial (deadline)"):
        return _row(line, "fail", ph["status"])
    ok = (
        ph["rows_compared"] == ph["rows_planned"]
        and ph["max_abs_diff"] is not None
        and ph["max_abs_diff"] <= ph["tolerance"]
        and ph["label_flips"] <= _flips_allowed(ph["rows_compared"])
    )
    return _row(
        line,
        "pass" if ok else "fail",
        f"{ph['device']}: {ph['rows_compared']:,}/{ph['rows_planned']:,} "
        f"rows, max |Δ| {_num(ph['max_abs_diff'])}, {ph['label_flips']} flips",
    )


def _flips_allowed(rows: int) -> int:
    """Label flips bf16 may cause on ``rows`` rows: :data:`BF16_FLIP_LIMIT` of them, at least one (a score
    within bf16's error of 0.5 can flip on any corpus)."""
    return max(1, int(BF16_FLIP_LIMIT * rows))


def _status_row(
    results: dict[str, Any], key: str, line: str, evidence: Callable[[dict[str, Any]], str]
) -> dict[str, str]:
    ph = _phase(results, key)
    if ph is None:
        return _row(line, "pending", f"phase {PHASES[key][0]} not run")
    if ph["status"] in ("not applicable", "not measured"):
        return _row(line, ph["status"], ph.get("reason", ""))
    if ph["status"] != "ok":
        return _row(line, "fail", ph["status"])
    return _row(line, "pass" if evidence(ph) == "" else "fail", evidence(ph) or "ok")


def _oom_problems(ph: dict[str, Any]) -> str:
    if (
        ph["rows_scored"] == ph["rows"]
        and ph["oom_splits"] > 0
        and (ph["ref_max_abs_diff"] or 0) <= FP32_TOLERANCE
    ):
        return ""
    return f"{ph['rows_scored']}/{ph['rows']} rows scored, oomSplits {ph['oom_splits']}"


def _lease_rows(results: dict[str, Any]) -> list[dict[str, str]]:
    ph = _phase(results, "lease")
    pure_line = "check_lease_device: a lease's own uuid passes, another uuid is refused (AffinityError)"
    device_line = (
        "On the device: handler device_uuid(model) = NVML's uuid, a lease on another uuid is refused"
    )
    if ph is None:
        return [
            _row(pure_line, "pending", "phase f not run"),
            _row(device_line, "pending", "phase f not run"),
        ]
    if "pure" not in ph:
        return [_row(pure_line, "fail", ph["status"]), _row(device_line, "fail", ph["status"])]
    pure = ph["pure"]
    pure_ok = pure["match_refused"] is False and pure["mismatch_refused"] is True
    rows = [
        _row(
            pure_line,
            "pass" if pure_ok else "fail",
            f"match refused: {pure['match_refused']}, mismatch refused: {pure['mismatch_refused']}",
        )
    ]
    if ph["status"] != "ok":
        return [*rows, _row(device_line, "fail", ph["status"])]
    if results["mode"] != "gpu":
        ok = ph["device_uuid"] is None
        rows.append(
            _row(
                device_line,
                "not applicable" if ok else "fail",
                "CPU dry run: device_uuid(model) is None" if ok else f"CPU device_uuid {ph['device_uuid']!r}",
            )
        )
        return rows
    ok = ph["uuids_equal"] and ph["own_lease_refused"] is False and ph["other_lease_refused"] is True
    rows.append(
        _row(
            device_line,
            "pass" if ok else "fail",
            f"device_uuid {ph['device_uuid']}, NVML {ph['nvml_uuid']}; "
            f"own lease refused: {ph['own_lease_refused']}, other refused: {ph['other_lease_refused']}",
        )
    )
    return rows


def _deadlines(results: dict[str, Any]) -> dict[str, str]:
    line = "Every phase finished within its deadline (results written after each phase)"
    missing = [PHASES[k] for k in PHASES if k not in results["phases"]]
    off = [
        f"{PHASES[k]}: {p['status']}" for k, p in results["phases"].items() if p["status"].startswith(_CUT)
    ]
    if missing and not off and not results.get("finished"):
        return _row(line, "pending", f"{len(missing)} phase(s) to run")
    return _row(
        line,
        "fail" if off or missing else "pass",
        "; ".join(off + [f"{m}: not run" for m in missing]) or "all phases done",
    )


def acceptance(results: dict[str, Any]) -> list[dict[str, str]]:
    """The pass/fail table's rows for ``results`` as they stand."""
    return [
        _guard(results),
        _bundle(results),
        _reference(results),
        _ratios(results, "fp32"),
        _ratios(results, "bf16"),
        _verified(results),
        _bf16(results),
        _status_row(
            results,
            "oom",
            "Forced OOM through the runtime: every row scored right, oomSplits > 0",
            _oom_problems,
        ),
        *_lease_rows(results),
        _status_row(results, "ort", "ONNX Runtime CUDA rows (IO binding, TensorRT)", lambda ph: ""),
        _deadlines(results),
    ]


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


def _throughput_md(ph: dict[str, Any], mode: str) -> list[str]:
    unit = "sentences/s" if mode == "gpu" else "sentences/s (CPU)"
    lines = [
        f"{ph['texts']:,} corpus rows per timed pass, after an untimed pass over {ph['warmup_texts']:,}; "
        f"the runtime gets Arrow batches of {ph['arrow_batch']:,} rows.",
        "",
        f"| path | precision | batch | device | {unit} | GPU busy % | ref rows | max abs Δ vs ref | status |",
        "|---|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for c in ph["rows"]:
        rate = c.get("sentences_per_s")
        busy = c.get("gpu_busy_pct")
        lines.append(
            f"| {c['path']} | {c['precision']} | {c['batch']:,} | {c['device']} | "
            f"{'-' if rate is None else f'{rate:,.0f}'} | "
            f"{'not measured' if busy is None else f'{busy:.0f}'} | {c.get('ref_rows_compared', '-')} | "
            f"{_num(c.get('ref_max_abs_diff'))} | {c['status']} |"
        )
    return lines


def render(results: dict[str, Any]) -> str:
    """The markdown report."""
    table = acceptance(results)
    lines = [
        f"# GPU check ({'GPU' if results['mode'] == 'gpu' else 'CPU dry run'}) on {results['device']}",
        "",
        f"Started {results['started']}; command `{results['command']}`.",
        "",
        "## Acceptance",
        "",
        "| acceptance line | result | evidence |",
        "|---|---|---|",
    ]
    lines += [f"| {r['line']} | {r['status']} | {r['evidence']} |" for r in table]
    for key, title in PHASES.items():
        ph = results["phases"].get(key)
        lines += ["", f"## {title}", ""]
        if ph is None:
            lines.append("not run")
        elif key == "throughput" and "rows" in ph:
            lines += _throughput_md(ph, results["mode"])
        else:
            lines += ["```json", json.dumps(ph, indent=1, default=str), "```"]
    return "\n".join(lines) + "\n"


def write_results(results: dict[str, Any], out: Path) -> None:
    """``gpu_check.json`` and ``gpu_check.md`` in ``out``, each replaced atomically."""
    out.mkdir(parents=True, exist_ok=True)
    results["acceptance"] = acceptance(results)
    for name, text in (
        ("gpu_check.json", json.dumps(results, indent=1, default=str) + "\n"),
        ("gpu_check.md", render(results)),
    ):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out / name)
