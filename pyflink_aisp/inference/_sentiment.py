"""The review-sentiment ModelHandler: HF tokenizer + MiniLM/ONNX Runtime + logistic head."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pyflink_aisp.inference._handler import ModelHandler
from pyflink_aisp.inference._onnx import OnnxSentimentModel
from pyflink_aisp.models import ModelAssets

__all__ = ["SentimentHandler", "SentimentPrediction"]

#: ``(score, embedding)``: P(fresh) as a float and a ``(384,)`` float32 L2-normalised embedding.
SentimentPrediction = tuple[float, npt.NDArray[np.float32]]


class SentimentHandler(ModelHandler[str, SentimentPrediction, OnnxSentimentModel]):
    """Scores texts with the built sentiment model (tokenization fused in).

    Args:
        assets: Built model assets; the ONNX file's sha256 is checked at load.
        intra_op_num_threads: ONNX Runtime intra-op threads (None: ORT's default,
            one per physical core).
    """

    def __init__(self, assets: ModelAssets, *, intra_op_num_threads: int | None = None) -> None:
        self._assets = assets
        self._threads = intra_op_num_threads

    def load_model(self) -> OnnxSentimentModel:
        """Open one ONNX Runtime session (CPU execution provider).

        Raises:
            ModelError: the file is missing or its sha256 differs from the manifest.
        """
        self._assets.verify()
        return OnnxSentimentModel(self._assets, intra_op_num_threads=self._threads)

    def run_inference(
        self, batch: Sequence[str], model: OnnxSentimentModel
    ) -> list[SentimentPrediction]:
        """Tokenize (truncation to ``assets.max_length``) and score ``batch``, in order."""
        scores, embeddings = model.predict(list(batch))
        return [(float(scores[i]), embeddings[i]) for i in range(len(batch))]

    def example_tokens(self, example: str, model: OnnxSentimentModel) -> int:
        """Token count of the text after truncation (the tokenizer the model uses)."""
        return model.tokenizer.count_tokens(example)

    def model_version(self) -> str:
        """The sha256 of the ONNX file."""
        return self._assets.sha256
