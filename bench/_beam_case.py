"""Case (d) of the inference benchmark: Apache Beam RunInference with its ONNX handler.

``apache_beam.ml.inference.onnx_inference.OnnxModelHandlerNumpy`` over the
same ``model.onnx``, CPU execution provider, on the DirectRunner (in-process
FnApiRunner, one worker), with RunInference's default batching
(``beam.BatchElements``: adaptive, 1..10,000 elements, aiming at batches that
take up to 10 s). Elements are 0-d numpy string arrays (the handler's element
type); the custom ``inference_fn`` tokenizes the batch with the project's
tokenizer and feeds the model's three inputs. Two inference functions:

- ``plain``: pad the Beam batch to its longest text, one ``session.run``
  (what a user writes first);
- ``sorted``: the plain loop's way, length-sorted sub-batches of the given
  size, so the gap to (a) is the framework alone.

The handler is subclassed only to build ``SessionOptions`` in
``load_model`` (they do not pickle), for the same ORT threads as elsewhere.
Timing is kept in this module (the DirectRunner runs in this process): first
``inference_fn`` start to last end, so pipeline start-up and model load are not
counted; the pipeline's wall time is reported beside it.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from apache_beam.ml.inference.onnx_inference import OnnxModelHandlerNumpy

__all__ = ["BeamResult", "run_beam"]

#: Filled by ``_inference_fn`` (same process as the DirectRunner's worker).
_TIMING: dict[str, Any] = {}
_TOKENIZERS: dict[str, Any] = {}


@dataclass(frozen=True, kw_only=True)
class BeamResult:
    """One Beam run.

    Attributes:
        rows: Elements scored.
        compute_s: First ``inference_fn`` start to last end, seconds.
        pipeline_s: ``pipeline.run().wait_until_finish()`` wall time, seconds.
        batch_sizes: Elements per Beam batch -> number of batches.
    """

    rows: int
    compute_s: float
    pipeline_s: float
    batch_sizes: dict[int, int] = field(default_factory=dict)

    @property
    def records_per_s(self) -> float:
        """Elements per second of steady state."""
        return self.rows / self.compute_s if self.compute_s > 0 else 0.0


def _tokenizer(path: str) -> Any:
    if path not in _TOKENIZERS:
        from pyflink_aisp.tokenize import ArrowTokenizer, TokenizerConfig

        _TOKENIZERS[path] = ArrowTokenizer.from_file(path, TokenizerConfig(max_length=128))
    return _TOKENIZERS[path]


def _inference_fn(
    session: Any, batch: Any, inference_args: Any = None, *, tokenizer_path: str, sort_size: int | None
) -> np.ndarray:
    """``OnnxModelHandlerNumpy`` inference function: texts -> P(fresh), ``(n,)`` float32.

    Beam calls it as ``inference_fn(session, batch, inference_args)``.
    """
    start = time.time()
    tokenizer = _tokenizer(tokenizer_path)
    tokens = tokenizer.encode([str(x) for x in batch])
    scores = np.empty((len(batch),), dtype=np.float32)
    padded_batches = (tokenizer.iter_buckets(tokens, sort_size) if sort_size
                      else iter([tokenizer.pad(tokens)]))
    for padded in padded_batches:
        with padded:
            (score,) = session.run(["score"], padded.model_inputs())
        scores[padded.rows] = score.reshape(-1)
    _TIMING.setdefault("first", start)
    _TIMING["last"] = time.time()
    sizes = _TIMING.setdefault("sizes", {})
    sizes[len(batch)] = sizes.get(len(batch), 0) + 1
    return scores


class _ThreadedOnnxHandler(OnnxModelHandlerNumpy):  # type: ignore[misc]
    """The stock handler, with ``SessionOptions`` built at load (they do not pickle).

    Args:
        intra_op_threads: ONNX Runtime intra-op threads.
        *args: As ``OnnxModelHandlerNumpy``.
        **kwargs: As ``OnnxModelHandlerNumpy``.
    """

    def __init__(self, intra_op_threads: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._intra_op_threads = intra_op_threads

    def load_model(self) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self._intra_op_threads
        options.inter_op_num_threads = 1
        self._session_options = options
        return super().load_model()


def _handler(model_path: Path, tokenizer_path: Path, intra_op_threads: int, sort_size: int | None) -> Any:
    fn = functools.partial(_inference_fn, tokenizer_path=str(tokenizer_path), sort_size=sort_size)
    return _ThreadedOnnxHandler(intra_op_threads, str(model_path), providers=["CPUExecutionProvider"],
                                inference_fn=fn)


def run_beam(
    texts: list[str], model_path: Path, tokenizer_path: Path, *, intra_op_threads: int,
    sort_size: int | None = None,
) -> BeamResult:
    """Score ``texts`` with RunInference on the DirectRunner.

    Args:
        texts: Review texts.
        model_path: ``model.onnx``.
        tokenizer_path: ``tokenizer.json``.
        intra_op_threads: ONNX Runtime intra-op threads.
        sort_size: None: one padded ``session.run`` per Beam batch; else
            length-sorted sub-batches of this many texts.

    Returns:
        Timing and batch sizes.
    """
    import apache_beam as beam
    from apache_beam.ml.inference.base import RunInference
    from apache_beam.options.pipeline_options import PipelineOptions

    _TIMING.clear()
    handler = _handler(model_path, tokenizer_path, intra_op_threads, sort_size)
    options = PipelineOptions(["--runner=DirectRunner", "--direct_num_workers=1"])
    start = time.perf_counter()
    with beam.Pipeline(options=options) as pipeline:
        _ = (pipeline
             | beam.Create(texts, reshuffle=False)
             | beam.Map(np.asarray)
             | RunInference(handler)
             | beam.Map(lambda result: float(result.inference)))
    pipeline_s = time.perf_counter() - start
    sizes = dict(sorted(_TIMING.get("sizes", {}).items()))
    return BeamResult(rows=sum(k * v for k, v in sizes.items()),
                      compute_s=_TIMING.get("last", 0.0) - _TIMING.get("first", 0.0),
                      pipeline_s=pipeline_s, batch_sizes=sizes)
