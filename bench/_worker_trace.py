"""Where the Python worker's wall time goes in a throughput run (``colocation_bench.py``), from the
Arrow operator's per-batch trace (``--latency-trace-dir``: one JSON line per Arrow batch with the
wall-clock ms at entry, after decode, after inference and at return, and the batch's record ids).

Over the span from the first batch's entry to the last batch's return, per record: decode (entry →
decoded: the records to texts), inference (decoded → inferred: the batcher's cuts, tokenizing and every
model call), render (inferred → return: the output rows), and the gaps between one batch's return and
the next one's entry: PyFlink's own Arrow conversion and gRPC in the worker, and the worker waiting for
the JVM (a bundle end, the next Arrow batch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["worker_time"]


def _batches(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def worker_time(directory: Path) -> dict[str, float]:
    """The busiest trace file's split of wall time, in ms per record.

    Args:
        directory: A ``--latency-trace-dir``; a job's start-up probe writes a file of its own (another
            worker process), so the file with the most records is the measured run.

    Returns:
        ``records``, ``batches``, ``span_s``, and ms per record for ``decode``, ``inference``,
        ``render`` and ``gap`` (they add up to ``span_s`` per record), and ``records_per_batch``.

    Raises:
        FileNotFoundError: The directory holds no trace file.
    """
    files = sorted(directory.glob("aisp-latency-*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no aisp-latency-*.jsonl in {directory}")
    batches = max((_batches(f) for f in files), key=lambda bs: sum(len(b["ids"]) for b in bs))
    batches.sort(key=lambda b: b["enter_ms"])
    records = sum(len(b["ids"]) for b in batches)
    span_ms = batches[-1]["exit_ms"] - batches[0]["enter_ms"]
    decode = sum(b["decoded_ms"] - b["enter_ms"] for b in batches)
    inference = sum(b["inferred_ms"] - b["decoded_ms"] for b in batches)
    render = sum(b["exit_ms"] - b["inferred_ms"] for b in batches)
    gap = span_ms - decode - inference - render
    return {"records": records, "batches": len(batches), "span_s": span_ms / 1000.0,
            "records_per_batch": records / len(batches),
            **{k: v / records for k, v in (("decode", decode), ("inference", inference), ("render", render),
                                           ("gap", gap))}}
