"""The review-sentiment ModelHandler: HF tokenizer + MiniLM/ONNX Runtime + logistic head."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pyflink_aisp.checksums import verify_sha256
from pyflink_aisp.errors import ConfigError, ModelError
from pyflink_aisp.inference._handler import ModelHandler, Prepared
from pyflink_aisp.inference.handlers._onnx import (
    ExecutionProvider,
    OnnxSentimentModel,
    ProviderSpec,
    normalize_providers,
    provider_device,
)
from pyflink_aisp.inference.handlers._onnx_profile import OrtProfiling
from pyflink_aisp.inference.handlers._onnx_runs import MAX_CONCURRENT_RUNS, run_threads
from pyflink_aisp.inference.handlers._probe import (
    SWAP_PROBE_TEXTS,
    check_probe_batch_sizes,
    check_probe_outputs,
)
from pyflink_aisp.inference.tasks import SentimentTask
from pyflink_aisp.models import ModelAssets

__all__ = ["SentimentHandler", "SentimentPrediction", "TokenizedTextsMixin"]

#: ``(score, embedding)``: P(fresh) as a float and a ``(384,)`` float32 L2-normalised embedding.
SentimentPrediction = tuple[float, npt.NDArray[np.float32]]


class TokenizedTextsMixin:
    """What the sentiment handlers (ONNX and PyTorch) share: their task
    (:class:`~pyflink_aisp.inference.SentimentTask`) and the batch-path hooks, one
    tokenizer call per submitted batch, one model call per model batch.

    The model must offer ``encode(texts) -> TokenizedBatch`` and
    ``predict_rows(tokens, rows) -> (scores (k,), embeddings (k, dim))``.
    """

    def task(self, *, with_embedding: bool = False) -> SentimentTask:
        """``score``, ``label`` (and the ``embedding`` with ``with_embedding``)."""
        return SentimentTask(with_embedding=with_embedding)

    def prepare_batch(self, batch: Sequence[str], model: Any) -> Prepared:
        """Tokenize the whole batch once; lengths are token counts after truncation.

        Raises:
            TokenizeError: An input is not a ``str`` (the runtime then isolates it).
        """
        tokens = model.encode(batch)
        return Prepared(tokens, tokens.lengths)

    def run_prepared(
        self, prepared: Prepared, rows: npt.NDArray[np.intp], model: Any
    ) -> list[SentimentPrediction]:
        """Score ``rows`` of the tokenized batch in one model call, in ``rows`` order."""
        scores, embeddings = model.predict_rows(prepared.payload, rows)
        return list(zip(scores.tolist(), embeddings, strict=True))


class SentimentHandler(TokenizedTextsMixin, ModelHandler[str, SentimentPrediction, OnnxSentimentModel]):
    """Scores texts with the built sentiment model (tokenization fused in).

    Args:
        assets: Built model assets; the ONNX file's sha256 is checked at load.
        intra_op_num_threads: ONNX Runtime intra-op threads (None: ORT's default,
            one per physical core).
        providers: ONNX Runtime execution providers in priority order (default
            CPU only); a CUDA/TensorRT first provider runs through IO binding.
            Availability is checked at load, on the worker.
        device_id: CUDA device of the CUDA/TensorRT providers (None: their
            ``device_id`` option, else 0).
        allow_spinning: ORT intra-op threads spin-wait between runs (see
            :class:`~pyflink_aisp.inference.OnnxSentimentModel`); None: ORT's default.
        concurrent_runs: Model batches of the batch path computing at once, each
            ``session.run`` on its own thread (:meth:`pipeline_depth`; CPU provider only:
            the session refuses it with IO binding). Above 1 with ``intra_op_num_threads``
            None, each run gets the worker host's physical cores / ``concurrent_runs``
            intra-op threads (at least 1; :func:`run_threads`, counted at load), so the runs
            share the cores instead of each taking all of them. 1: one batch at a time.
        profiling: ONNX Runtime's profiler over each worker's first runs (see
            :class:`~pyflink_aisp.inference.OnnxSentimentModel`); None: not profiled.

    Raises:
        ConfigError: Unknown provider name or a ``device_id`` that does not fit
            (see :func:`~pyflink_aisp.inference.normalize_providers`), or
            ``concurrent_runs`` out of 1..8.
    """

    def __init__(
        self,
        assets: ModelAssets,
        *,
        intra_op_num_threads: int | None = None,
        providers: Sequence[ProviderSpec] = (ExecutionProvider.CPU,),
        device_id: int | None = None,
        allow_spinning: bool | None = None,
        concurrent_runs: int = 1,
        profiling: OrtProfiling | None = None,
    ) -> None:
        if not 1 <= concurrent_runs <= MAX_CONCURRENT_RUNS:
            raise ConfigError(f"concurrent_runs must be in 1..{MAX_CONCURRENT_RUNS}, got {concurrent_runs}")
        self._runs = concurrent_runs
        self._assets = assets
        self._threads = intra_op_num_threads
        self._allow_spinning = allow_spinning
        self._profiling = profiling
        self._providers = normalize_providers(providers, device_id)
        self._device = provider_device(self._providers)

    def load_model(self) -> OnnxSentimentModel:
        """Open one ONNX Runtime session on the configured providers.

        Raises:
            ModelError: the file is missing, a provider is unavailable or fails
                to initialise (no fallback to CPU).
            ChecksumError: the files' sha256 differ from the manifest.
        """
        self._assets.verify()
        return self._open_model(self._assets)

    def run_inference(
        self, batch: Sequence[str], model: OnnxSentimentModel
    ) -> list[SentimentPrediction]:
        """Tokenize (truncation to ``assets.max_length``) and score ``batch``, in order."""
        scores, embeddings = model.predict(list(batch))
        return [(float(scores[i]), embeddings[i]) for i in range(len(batch))]

    def pipeline_depth(self, model: OnnxSentimentModel) -> int:
        """The model's concurrent runs (the constructor's ``concurrent_runs``)."""
        return model.runs.runs

    def launch_prepared(self, prepared: Prepared, rows: npt.NDArray[np.intp],
                        model: OnnxSentimentModel) -> Any:
        """Start ``rows`` of the tokenized batch on one of the model's run threads."""
        return model.launch_rows(prepared.payload, rows)

    def collect_prepared(self, handle: Any, model: OnnxSentimentModel) -> list[SentimentPrediction]:
        """Wait for a launched batch; its predictions in the order of its rows.

        Raises:
            Exception: whatever the run raised (the batcher then isolates its rows).
        """
        scores, embeddings = handle.result()
        return list(zip(scores.tolist(), embeddings, strict=True))

    def release_model(self, model: OnnxSentimentModel) -> None:
        """Stop the model's run threads (after the runs in flight)."""
        model.close()

    def example_tokens(self, example: str, model: OnnxSentimentModel) -> int:
        """Token count of the text after truncation (the tokenizer the model uses)."""
        return model.tokenizer.count_tokens(example)

    def model_version(self) -> str:
        """The sha256 of the ONNX file."""
        return self._assets.sha256

    def load_version(self, path: Path, sha256: str) -> OnnxSentimentModel:
        """Load another ONNX file of the model (hot swap): same tokenizer, inputs and outputs.

        The file is hashed against ``sha256``, opened on this handler's providers,
        and scores the probe set :data:`~pyflink_aisp.inference.SWAP_PROBE_TEXTS`
        in one batch: scores ``(n,)`` finite in [0, 1], embeddings
        ``(n, embedding_dim)`` finite and L2-normalised, and not degenerate (not
        one score, one label or one embedding for all probes); see
        :func:`~pyflink_aisp.inference.check_probe_outputs`. The first probes are
        scored again in batches of 1 and 7 and must match
        (:func:`~pyflink_aisp.inference.handlers._probe.check_probe_batch_sizes`).

        Raises:
            ChecksumError: the file's sha256 is not ``sha256``.
            ModelError: the file is missing, does not load, or fails the probe
                (the message names the failed check).
        """
        verify_sha256(path, sha256)
        model = self._open_model(dataclasses.replace(self._assets, onnx_path=Path(path), sha256=sha256))
        try:
            scores, embeddings = model.predict(list(SWAP_PROBE_TEXTS))
        except Exception as exc:  # ORT raises its own types for a graph with other inputs/outputs
            raise ModelError(f"model {path} does not run as a sentiment model: {exc}") from exc
        check_probe_outputs(scores, embeddings, embedding_dim=self._assets.embedding_dim, source=str(path))
        check_probe_batch_sizes(model.predict, scores, source=str(path))
        return model

    # -- devices and providers (kept apart from the hot-swap code) --------------------

    def _open_model(self, assets: ModelAssets) -> OnnxSentimentModel:
        """A session over ``assets`` (already verified by the caller) with this
        handler's threads and providers.

        Raises:
            ModelError: a provider is unavailable or the model cannot be loaded.
        """
        threads = self._threads if self._threads is not None else run_threads(self._runs)
        return OnnxSentimentModel(
            assets, intra_op_num_threads=threads, providers=self._providers, verify=False,
            allow_spinning=self._allow_spinning, concurrent_runs=self._runs, profiling=self._profiling
        )

    @property
    def providers(self) -> list[str]:
        """The configured execution provider names, in priority order."""
        return [name for name, _ in self._providers]

    def device(self) -> str:
        """``"cuda:N"`` when the first provider is CUDA/TensorRT, else ``"cpu"``."""
        return self._device
