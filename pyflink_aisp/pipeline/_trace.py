"""Per-Arrow-batch latency trace of the arrow operator (``--latency-trace-dir``).

Each Python worker appends one JSON object per Arrow batch to
``aisp-latency-<pid>-<subtask>.jsonl`` in the directory::

    {"enter_ms": 1733180000123.4, "decoded_ms": ..., "inferred_ms": ..., "exit_ms": ...,
     "ids": ["r1", "r2", ...]}

The times are wall-clock milliseconds since the Unix epoch (``time.time()``, float64), the
clock Kafka stamps records with, so a reader joins them by id to the input and output
records' broker timestamps (``LogAppendTime``) and splits end-to-end latency into: Kafka to
the worker (source fetch, network, Arrow batch forming, the hop to the worker), decode,
inference (queue and model), render, and the worker to Kafka (bundle end, the hop back, the
sink and its producer). ``ids`` are the ids of the records that reached the model, in
input order (dead letters of decode have none).

A diagnostic: the file grows by about 30 bytes per record plus 100 per batch, without
bound, so use it for bench runs, not production.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO

__all__ = ["LatencyTrace"]


class LatencyTrace:
    """Appends the batch lines of one operator instance; opened in the worker (not pickled open).

    Args:
        directory: Where the trace files go; made if missing.
    """

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._file: IO[str] | None = None

    def open(self, subtask: int) -> None:
        """Open (append) this worker's file.

        Raises:
            OSError: The directory cannot be made or the file opened.
        """
        self._directory.mkdir(parents=True, exist_ok=True)
        path = self._directory / f"aisp-latency-{os.getpid()}-{subtask}.jsonl"
        self._file = path.open("a", encoding="utf-8", buffering=1)

    def write(self, enter_ms: float, decoded_ms: float, inferred_ms: float, exit_ms: float,
              ids: list[str]) -> None:
        """Append one batch's line (no-op before :meth:`open` or after :meth:`close`)."""
        if self._file is not None:
            self._file.write(json.dumps({"enter_ms": enter_ms, "decoded_ms": decoded_ms,
                                         "inferred_ms": inferred_ms, "exit_ms": exit_ms, "ids": ids}) + "\n")

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __getstate__(self) -> dict[str, object]:
        return {"_directory": self._directory, "_file": None}
