"""What the generic text-encoder handlers share: pooling, token fields, versions, batch hooks.

:class:`~pyflink_aisp.inference.OnnxEncoderHandler` and
:class:`~pyflink_aisp.inference.TorchEncoderHandler` turn texts into one float32
vector each. Both tokenize with :class:`~pyflink_aisp.tokenize.ArrowTokenizer`
(one ``encode`` per submitted batch, :meth:`TextEncoderHandler.prepare_batch`),
pad exactly the rows of one model batch (:meth:`TextEncoderHandler.run_prepared`)
and reduce the model's output with a :class:`Pooling`:

- ``MEAN``: sentence-transformers' mean pooling (``models.Pooling`` with
  ``pooling_mode_mean_tokens``): the sum of token vectors where
  ``attention_mask`` is 1, divided by the token count clamped at 1e-9.
- ``CLS``: the vector of the first position (``pooling_mode_cls_token``; the
  ``[CLS]``/``<s>`` token with right padding, the only padding used here).
- ``NONE``: the output is already one vector per text.

``normalize`` divides by the L2 norm clamped at 1e-12, as
``torch.nn.functional.normalize`` (sentence-transformers ``models.Normalize``).
"""

from __future__ import annotations

import abc
import enum
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from pyflink_aisp.checksums import sha256_file
from pyflink_aisp.errors import ChecksumError, ConfigError, ModelError, TokenizeError
from pyflink_aisp.inference._handler import ModelHandler, Prepared
from pyflink_aisp.inference.tasks import EmbeddingTask
from pyflink_aisp.tokenize import ArrowTokenizer, PaddedBatch, TokenizedBatch

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "MEAN_CLAMP",
    "NORM_EPS",
    "PREFIX_CHARS_PER_TOKEN",
    "Embedding",
    "EncoderModel",
    "Pooling",
    "TextEncoderHandler",
    "TokenField",
    "check_token_fields",
    "coerce_pooling",
    "pool_embeddings",
    "resolve_max_length",
]

#: One prediction: a ``(dim,)`` float32 vector.
Embedding = npt.NDArray[np.float32]

#: ``max_length`` when neither the caller nor the ``tokenizer.json`` (its
#: ``truncation.max_length``) gives one: the ``max_seq_length`` of most
#: sentence-transformers MiniLM checkpoints (paraphrase-MiniLM-L3-v2; the
#: all-MiniLM-L6-v2 tokenizer.json also says 128).
DEFAULT_MAX_LENGTH = 128
#: Characters of a text that :meth:`TextEncoderHandler.example_tokens` tokenizes,
#: per token of ``max_length``. English averages 4-5 characters per WordPiece or
#: BPE token, so the prefix almost always holds ``max_length`` tokens already.
PREFIX_CHARS_PER_TOKEN = 12
#: Lower bound of the token count in mean pooling (sentence-transformers ``Pooling``).
MEAN_CLAMP = 1e-9
#: Lower bound of the norm in L2 normalisation (``torch.nn.functional.normalize``).
NORM_EPS = 1e-12


class Pooling(enum.StrEnum):
    """How the model output becomes one vector per text."""

    #: The output is already ``(batch, dim)``.
    NONE = "none"
    #: Attention-mask mean over a ``(batch, seq_len, dim)`` output.
    MEAN = "mean"
    #: Position 0 of a ``(batch, seq_len, dim)`` output.
    CLS = "cls"

    @property
    def output_rank(self) -> int:
        """Rank of the model output this pooling takes: 2 for ``NONE``, else 3."""
        return 2 if self is Pooling.NONE else 3


class TokenField(enum.StrEnum):
    """Tokenizer outputs a model can be fed (keys of ``PaddedBatch.model_inputs()``)."""

    INPUT_IDS = "input_ids"
    ATTENTION_MASK = "attention_mask"
    TOKEN_TYPE_IDS = "token_type_ids"


def coerce_pooling(value: Pooling | str) -> Pooling:
    """``value`` as a :class:`Pooling` (job parameters arrive as strings).

    Raises:
        ConfigError: Not a pooling name.
    """
    try:
        return Pooling(value)
    except ValueError as exc:
        raise ConfigError(f"pooling must be one of {[p.value for p in Pooling]}, got {value!r}") from exc


def pool_embeddings(
    output: npt.NDArray[Any],
    attention_mask: npt.NDArray[np.integer],
    pooling: Pooling,
    *,
    normalize: bool,
    source: str = "model output",
) -> npt.NDArray[np.float32]:
    """Reduce a model output to one float32 vector per text (numpy, see the module docstring).

    Args:
        output: ``(batch, dim)`` for ``NONE``, ``(batch, seq_len, dim)`` otherwise; any float dtype.
        attention_mask: ``(batch, seq_len)`` 1 for tokens, 0 for padding.
        pooling: The reduction.
        normalize: Divide each vector by its L2 norm (clamped at :data:`NORM_EPS`).
        source: Name of the output, for messages.

    Returns:
        ``(batch, dim)`` float32.

    Raises:
        ModelError: The output's rank does not fit ``pooling``, or it is not floating point.
    """
    if output.ndim != pooling.output_rank or output.dtype.kind != "f":
        raise ModelError(
            f"{source} is {output.dtype} with shape {output.shape}; pooling {pooling.name} needs a "
            f"floating-point rank-{pooling.output_rank} output"
        )
    values = output.astype(np.float32, copy=False)
    if pooling is Pooling.NONE:
        pooled = values
    elif pooling is Pooling.CLS:
        pooled = values[:, 0, :]
    else:
        mask = attention_mask.astype(np.float32)[:, :, None]
        pooled = (values * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), np.float32(MEAN_CLAMP))
    if normalize:
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        pooled = pooled / np.maximum(norms, np.float32(NORM_EPS))
    return np.ascontiguousarray(pooled, dtype=np.float32)


def resolve_max_length(tokenizer_path: Path, max_length: int | None) -> int:
    """``max_length``, else the ``tokenizer.json``'s ``truncation.max_length``, else 128.

    Raises:
        ModelError: The file cannot be read as JSON.
    """
    if max_length is not None:
        return max_length
    try:
        raw = json.loads(Path(tokenizer_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read tokenizer {tokenizer_path}: {exc}") from exc
    truncation = raw.get("truncation") if isinstance(raw, dict) else None
    limit = truncation.get("max_length") if isinstance(truncation, dict) else None
    return int(limit) if isinstance(limit, int) and limit > 0 else DEFAULT_MAX_LENGTH


class EncoderModel(Protocol):
    """What the shared hooks need of a loaded encoder."""

    tokenizer: ArrowTokenizer

    def embed(self, padded: PaddedBatch) -> npt.NDArray[np.float32]:
        """``(k, dim)`` float32 vectors of the ``k`` padded rows, in their order."""
        ...


EncoderT = TypeVar("EncoderT", bound=EncoderModel)


class TextEncoderHandler(ModelHandler[str | tuple[str, str], Embedding, EncoderT]):
    """Texts (or text pairs) in, one ``(dim,)`` float32 vector out; tokenization and versions shared.

    An example is a ``str``, or a ``(text, text_pair)`` tuple of two ``str`` for a pair model
    (a cross-encoder or NLI classifier), tokenized as HF's ``tokenizer(text, text_pair)``
    (:meth:`ArrowTokenizer.encode` with ``pairs``); one batch holds one kind.

    Subclasses implement :meth:`load_model` (returning an :class:`EncoderModel`)
    and :meth:`_version_inputs`. The model version is the sha256 of a text that
    names the handler kind, the sha256 of every model file and of the
    ``tokenizer.json``, and the options that change outputs; it is computed on
    first use (reading the files) and checked again by :meth:`load_model`
    through :meth:`_check_version`, so a worker refuses files that differ from
    those the version was taken from.
    """

    def __init__(self, *, max_length: int | None = None, intra_op_num_threads: int | None = None) -> None:
        """Check the options both runtimes share.

        Raises:
            ConfigError: ``max_length`` or ``intra_op_num_threads`` < 1.
        """
        if max_length is not None and max_length < 1:
            raise ConfigError(f"max_length must be >= 1 or None, got {max_length}")
        if intra_op_num_threads is not None and intra_op_num_threads < 1:
            raise ConfigError(f"intra_op_num_threads must be >= 1 or None, got {intra_op_num_threads}")
        self._version: str | None = None

    accepts_text_pairs = True

    @abc.abstractmethod
    def _version_inputs(self) -> tuple[str, list[Path], dict[str, str]]:
        """``(tag, files, options)`` that make up the model version."""

    def _file_version(self) -> str:
        """The version from the files as they are now.

        Raises:
            ModelError: A file is missing or unreadable.
        """
        tag, files, options = self._version_inputs()
        lines = [tag]
        for path in files:
            if not path.is_file():
                raise ModelError(f"model file {path} not found")
            lines.append(f"{path.name} {sha256_file(path)}")
        lines.extend(f"{key}={options[key]}" for key in sorted(options))
        return hashlib.sha256(("\n".join(lines) + "\n").encode("utf-8")).hexdigest()

    def _check_version(self) -> str:
        """Hash the files (at load) and compare with a version already handed out.

        Raises:
            ModelError: A file is missing or unreadable.
            ChecksumError: The files changed since :meth:`model_version` was taken.
        """
        actual = self._file_version()
        if self._version is not None and actual != self._version:
            files = ", ".join(str(p) for p in self._version_inputs()[1])
            error = ChecksumError(files, self._version, actual)
            error.args = (f"{error.args[0]}; the model files changed since the model version was taken",)
            raise error
        self._version = actual
        return actual

    def task(self, *, with_embedding: bool = False) -> EmbeddingTask:
        """The ``embedding`` (the output itself: ``with_embedding`` adds nothing)."""
        return EmbeddingTask()

    def model_version(self) -> str:
        """sha256 over the model files, ``tokenizer.json`` and output-changing options.

        Raises:
            ModelError: A file is missing or unreadable (first call only).
        """
        if self._version is None:
            self._version = self._file_version()
        return self._version

    def run_inference(self, batch: Sequence[str | tuple[str, str]], model: EncoderT) -> list[Embedding]:
        """Tokenize ``batch`` and run it as one model call (padded to its longest text).

        Returns:
            One ``(dim,)`` float32 vector per text, in order.

        Raises:
            TokenizeError: An example is not a ``str`` or a pair of them, or the batch mixes
                texts and pairs.
        """
        examples = list(batch)
        _split_pairs(examples)
        if not examples:
            return []
        prepared = self.prepare_batch(examples, model)
        return self.run_prepared(prepared, np.arange(len(examples), dtype=np.intp), model)

    def example_tokens(self, example: str | tuple[str, str], model: EncoderT) -> int:
        """Token count after truncation, from a bounded prefix of the text (of each text of a pair).

        Only the first ``max_length * PREFIX_CHARS_PER_TOKEN`` characters are
        tokenized, so a huge text costs no more than a normal one. Exact for
        shorter texts and whenever the prefix reaches ``max_length`` tokens;
        else a lower bound (a hint for length buckets and token budgets only).

        Raises:
            TokenizeError: ``example`` is not a ``str`` or a ``(text, text_pair)`` tuple of them.
        """
        limit = model.tokenizer.config.max_length
        if isinstance(example, tuple) and len(example) == 2:
            text, text_pair = example
            if limit is not None and isinstance(text, str) and isinstance(text_pair, str):
                text, text_pair = (t[: limit * PREFIX_CHARS_PER_TOKEN] for t in example)
            return max(1, model.tokenizer.count_pair_tokens(text, text_pair))
        if not isinstance(example, str):
            raise TokenizeError(f"expected str or a (text, text_pair) tuple, got {type(example).__name__}")
        prefix = example if limit is None else example[: limit * PREFIX_CHARS_PER_TOKEN]
        return max(1, model.tokenizer.count_tokens(prefix))

    def prepare_batch(self, batch: Sequence[str | tuple[str, str]], model: EncoderT) -> Prepared:
        """Tokenize the whole batch in one :meth:`ArrowTokenizer.encode` call.

        Args:
            batch: ``n`` texts: a list of ``str``, a pyarrow string array or a pandas Series;
                or a list of ``n`` ``(text, text_pair)`` tuples.

        Returns:
            ``Prepared(payload=TokenizedBatch, lengths=(n,) int64 tokens after truncation)``.

        Raises:
            TokenizeError: A row is null or not text, or not a pair in a batch of pairs (the
                runtime then isolates it).
        """
        first = batch[0] if isinstance(batch, list | tuple) and len(batch) else None
        pairs = _split_pairs(list(batch)) if isinstance(first, tuple) else None
        tokens: TokenizedBatch = (model.tokenizer.encode(batch) if pairs is None
                                  else model.tokenizer.encode(*pairs))
        if tokens.input_ids.null_count:
            nulls = np.flatnonzero(tokens.input_ids.is_null().to_numpy(zero_copy_only=False))
            raise TokenizeError(f"rows {nulls[:10].tolist()} are null; expected str")
        return Prepared(tokens, tokens.lengths)

    def run_prepared(
        self, prepared: Prepared, rows: npt.NDArray[np.intp], model: EncoderT
    ) -> list[Embedding]:
        """Pad exactly ``rows`` of the tokenized batch and run one model call on them.

        Args:
            prepared: From :meth:`prepare_batch`.
            rows: ``(k,)`` row indices, in the order results are wanted.

        Returns:
            ``k`` ``(dim,)`` float32 vectors in the order of ``rows`` (rows of one
            ``(k, dim)`` array).

        Raises:
            ModelError: The model returned another number of vectors.
        """
        if len(rows) == 0:
            return []
        with model.tokenizer.pad(prepared.payload, rows) as padded:
            vectors = model.embed(padded)
        if vectors.ndim != 2 or vectors.shape[0] != len(rows):
            raise ModelError(f"model returned shape {vectors.shape} for {len(rows)} rows")
        return list(vectors)


def _split_pairs(examples: list[Any]) -> tuple[list[str], list[str]] | None:
    """``(texts, second texts)`` of a batch of ``(text, text_pair)`` tuples; None for a batch of
    ``str`` (or an empty one).

    Raises:
        TokenizeError: An example is neither a ``str`` nor a pair of them, or the batch mixes
            the two kinds.
    """
    if not examples or not isinstance(examples[0], tuple):
        for position, text in enumerate(examples):
            if not isinstance(text, str):
                kind = "a text pair in a batch of texts" if isinstance(text, tuple) else type(text).__name__
                raise TokenizeError(f"input {position} is {kind}, expected str")
        return None
    for position, pair in enumerate(examples):
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
            raise TokenizeError(f"input {position} is {type(pair).__name__}, expected a (text, text_pair) "
                                "tuple of two str like the batch's first")
    return [a for a, _ in examples], [b for _, b in examples]


def check_token_fields(mapping: Mapping[TokenField | str, str] | None) -> dict[TokenField, str] | None:
    """Validate a ``tokenizer field -> model input name`` mapping.

    Raises:
        ConfigError: Empty mapping, unknown field, empty or repeated input name.
    """
    if mapping is None:
        return None
    if not mapping:
        raise ConfigError("inputs must map at least one tokenizer field to a model input")
    checked: dict[TokenField, str] = {}
    for key, name in mapping.items():
        try:
            field = TokenField(key)
        except ValueError as exc:
            raise ConfigError(
                f"unknown tokenizer field {key!r}; known: {[f.value for f in TokenField]}"
            ) from exc
        if not isinstance(name, str) or not name:
            raise ConfigError(f"inputs[{field.value!r}] must be a non-empty input name, got {name!r}")
        checked[field] = name
    if len(set(checked.values())) != len(checked):
        raise ConfigError(f"inputs feeds one model input twice: {mapping!r}")
    return checked
