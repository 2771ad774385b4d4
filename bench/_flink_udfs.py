"""Worker-side PyFlink UDFs of the inference benchmark: cases (b) and (c).

Shipped to the Python worker with ``add_python_file`` and imported there by
name, so this module imports nothing from ``bench/`` and keeps its state per
worker. Each function loads the sentiment model in ``open()`` (ORT threads and
batch size as given, the same as the plain loop) and, in ``close()``, writes a
JSON timing record to ``timing_path``: the wall clock (``time.time()``, s) of
the first call's start and the last call's end, the rows scored and the sizes
of the batches it received. The throughput is rows / (last end - first start),
so the job's start-up and the model load are not counted.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pyflink.table.udf import FunctionContext, ScalarFunction

__all__ = ["PandasScore", "PerRecordScore"]


class _Timed(ScalarFunction):
    """Model loading and the timing record shared by both UDFs.

    Args:
        model_dir: Built model assets (``ModelAssets.directory``).
        intra_op_threads: ONNX Runtime intra-op threads.
        batch_size: ``OnnxSentimentModel.batch_size`` (texts per ``session.run``).
        timing_path: Where ``close()`` writes the timing record (JSON).
    """

    def __init__(self, model_dir: str, intra_op_threads: int, batch_size: int, timing_path: str) -> None:
        self._model_dir = model_dir
        self._threads = intra_op_threads
        self._batch_size = batch_size
        self._timing_path = timing_path
        self._model: Any = None
        self._first = 0.0
        self._last = 0.0
        self._rows = 0
        self._sizes: dict[int, int] = {}

    def open(self, function_context: FunctionContext) -> None:
        from pyflink_aisp.inference.handlers import OnnxSentimentModel
        from pyflink_aisp.models import load_model_assets

        self._model = OnnxSentimentModel(load_model_assets(Path(self._model_dir)),
                                         intra_op_num_threads=self._threads, batch_size=self._batch_size)

    def _score(self, texts: list[str]) -> Any:
        start = time.time()
        scores, _ = self._model.predict(texts)
        self._last = time.time()
        if not self._rows:
            self._first = start
        self._rows += len(texts)
        self._sizes[len(texts)] = self._sizes.get(len(texts), 0) + 1
        return scores

    def close(self) -> None:
        record = {"first_start_s": self._first, "last_end_s": self._last, "rows": self._rows,
                  "batch_sizes": {str(k): v for k, v in sorted(self._sizes.items())}}
        Path(self._timing_path).write_text(json.dumps(record))


class PerRecordScore(_Timed):
    """(b) A general Python UDF: one model call per row, ``text -> P(fresh)``."""

    def eval(self, text: str) -> float:
        return float(self._score([text])[0])


class PandasScore(_Timed):
    """(c) A pandas UDF: one ``predict`` per Arrow batch, ``pd.Series[str] -> pd.Series[float]``."""

    def eval(self, texts: Any) -> Any:
        import pandas as pd

        return pd.Series(self._score(texts.tolist()), dtype="float32")
