"""Building the real model assets (ONNX graph, sentiment head) with checksums.

Public API: :func:`ensure_model_assets` → :class:`ModelAssets`,
:func:`load_model_assets`,
:func:`build_encoder_model`, :func:`append_sentiment_head`,
:func:`locate_source_model`, :class:`BertConfig`, :func:`build_main`;
:func:`build_intent_classifier` (a third-party 157-intent classifier as a HF directory) and
:func:`build_intent_head` (its logistic regression alone, a numeric ONNX model on embeddings).
"""

from __future__ import annotations

from pyflink_aisp.models._assets import ModelAssets, assets_dir_name, ensure_model_assets, load_model_assets
from pyflink_aisp.models._cli import build_main
from pyflink_aisp.models._intent import (
    INTENT_DISTRIBUTION,
    build_intent_classifier,
    build_intent_head,
    build_minilm_encoder,
    locate_intent_models,
)
from pyflink_aisp.models._onnx_graph import (
    EMBEDDING_OUTPUT,
    INPUT_NAMES,
    SCORE_OUTPUT,
    append_sentiment_head,
    build_encoder_model,
)
from pyflink_aisp.models._paraphrase_minilm import (
    PARAPHRASE_DISTRIBUTION,
    ParaphraseMiniLM,
    locate_paraphrase_minilm,
)
from pyflink_aisp.models._source import BertConfig, SourceModel, locate_source_model

__all__ = [
    "EMBEDDING_OUTPUT",
    "INPUT_NAMES",
    "INTENT_DISTRIBUTION",
    "PARAPHRASE_DISTRIBUTION",
    "SCORE_OUTPUT",
    "BertConfig",
    "ModelAssets",
    "ParaphraseMiniLM",
    "SourceModel",
    "append_sentiment_head",
    "assets_dir_name",
    "build_encoder_model",
    "build_intent_classifier",
    "build_intent_head",
    "build_main",
    "build_minilm_encoder",
    "ensure_model_assets",
    "load_model_assets",
    "locate_intent_models",
    "locate_paraphrase_minilm",
    "locate_source_model",
]
