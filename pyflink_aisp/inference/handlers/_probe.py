"""The probe set a new model version must pass before a hot swap.

One sentence proves little: a model can score one short text and still return
NaN on long inputs, the same score for everything, or broken embeddings. A
handler's :meth:`~pyflink_aisp.inference.ModelHandler.load_version` therefore
scores :data:`SWAP_PROBE_TEXTS` in one batch and hands the outputs to
:func:`check_probe_outputs`, which refuses a version with a
:class:`~pyflink_aisp.errors.ModelError` naming the failed check.

What is checked is that the model is *sane*, not that it is as good as the
serving one: a retrained version may legitimately move scores, and the
handler is not given the serving model to compare with. The checks catch the
broken kinds: wrong shapes, non-finite or out-of-range scores, non-finite or
unnormalised embeddings, and a degenerate model (every probe the same score,
the same label, or the same embedding) -- e.g. a head whose intercept
saturates the sigmoid, or an encoder that ignores its input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NoReturn

import numpy as np
import numpy.typing as npt

from pyflink_aisp.errors import ModelError

__all__ = ["PROBE_BATCH_SIZES", "SWAP_PROBE_TEXTS", "check_probe_batch_sizes", "check_probe_outputs",
           "check_probe_vectors"]

#: Batch sizes the first probes are also scored at: a version that runs only at one
#: batch size (a graph exported with a static batch dimension of 16 passes a probe of
#: 16 texts, then fails every smaller batch the stream makes) is refused.
PROBE_BATCH_SIZES = (1, 7)
#: Most |score difference| between a probe scored alone or in a small batch and in the
#: whole probe batch (padding changes fp32 sums in the last bits; ORT CPU: < 1e-6).
BATCH_SCORE_TOLERANCE = 1e-4

#: Short review sentences, 8 positive and 7 negative (written for this check, in the
#: style of the Rotten Tomatoes snippets the model was trained on), plus the empty
#: string; one is longer than 128 tokens, so the truncation path runs too
#: (all-MiniLM-L6-v2's tokenizer: 2 to 128 tokens after truncation at 128).
SWAP_PROBE_TEXTS: tuple[str, ...] = (
    "",
    "Wonderful!",
    "Dull.",
    "Not bad.",
    "A gripping, beautifully acted film.",
    "Tedious, overlong and badly written.",
    "Funny and warm, with a terrific cast.",
    "The plot makes no sense and the jokes fall flat.",
    "One of the best films of the year.",
    "I wanted my two hours back.",
    "A moving, honest portrait of a family in trouble.",
    "Lazy, cynical and completely forgettable.",
    "Sharp writing and a lovely score carry it all the way.",
    "Even the talented cast cannot save this mess of a script.",
    "A clever, affectionate comedy that never talks down to its audience.",
    "The pacing drags, the dialogue is stilted and the ending is a cheat. " * 8,
)

#: Largest accepted ``| ||embedding|| - 1 |`` for L2-normalised embeddings (float32 sums).
_NORM_TOLERANCE = 1e-3
#: Scores (or embedding entries) closer than this count as equal for the degeneracy checks.
_EQUAL_TOLERANCE = 1e-6
#: A score at or above this is the positive label.
_LABEL_THRESHOLD = 0.5


def check_probe_outputs(
    scores: npt.ArrayLike,
    embeddings: npt.ArrayLike,
    *,
    embedding_dim: int,
    source: str,
    texts: Sequence[str] = SWAP_PROBE_TEXTS,
    normalized: bool = True,
) -> None:
    """Refuse a model version whose outputs on the probe texts are broken.

    Args:
        scores: ``(n,)`` probabilities, one per text of ``texts``, in order.
        embeddings: ``(n, embedding_dim)`` embeddings, one row per text.
        embedding_dim: The embedding size the serving model has.
        source: What was probed (the model path), for the message.
        texts: The texts scored (default :data:`SWAP_PROBE_TEXTS`); only their
            count and, in messages, their first characters are used.
        normalized: The embeddings must be L2-normalised (to within 1e-3).

    Raises:
        ModelError: ``"model <source> failed the swap probe (<check>): ..."``
            where ``<check>`` is one of ``shape``, ``non-finite score``,
            ``score outside [0, 1]``, ``non-finite embedding``,
            ``embedding not L2-normalised``, ``constant score``, ``one label``,
            ``identical embeddings``.
    """
    n = len(texts)
    s = np.asarray(scores, dtype=np.float64)
    e = np.asarray(embeddings, dtype=np.float64)
    if s.shape != (n,) or e.shape != (n, embedding_dim):
        _refuse(source, "shape", f"got scores {s.shape} and embeddings {e.shape}, "
                f"expected ({n},) and ({n}, {embedding_dim}) for {n} probe texts")
    _refuse_rows(source, "non-finite score", ~np.isfinite(s), s, texts)
    _refuse_rows(source, "score outside [0, 1]", (s < 0.0) | (s > 1.0), s, texts)
    _refuse_rows(source, "non-finite embedding", ~np.isfinite(e).all(axis=1), None, texts)
    if normalized:
        norms = np.linalg.norm(e, axis=1)
        unnormalised = np.abs(norms - 1.0) > _NORM_TOLERANCE
        _refuse_rows(source, "embedding not L2-normalised", unnormalised, norms, texts)
    if n > 1 and float(s.max() - s.min()) <= _EQUAL_TOLERANCE:
        _refuse(source, "constant score", f"every probe scored {s[0]:.6g}")
    positive = int(np.count_nonzero(s >= _LABEL_THRESHOLD))
    if n > 1 and positive in (0, n):
        label = "positive" if positive else "negative"
        _refuse(source, "one label", f"all {n} probes (positive and negative reviews) scored {label} "
                f"(scores {s.min():.3g} to {s.max():.3g})")
    if n > 1 and float(np.abs(e - e[0]).max()) <= _EQUAL_TOLERANCE:
        _refuse(source, "identical embeddings", f"all {n} probes got the same embedding")


def check_probe_batch_sizes(
    predict: Callable[[list[str]], tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]],
    scores: npt.ArrayLike,
    *,
    source: str,
    texts: Sequence[str] = SWAP_PROBE_TEXTS,
) -> None:
    """Score the first ``k`` probes for each ``k`` of :data:`PROBE_BATCH_SIZES` and
    compare with their scores in the whole batch.

    Args:
        predict: ``texts -> (scores (k,), embeddings (k, dim))`` of the new version.
        scores: ``(n,)`` scores of all ``texts`` in one batch (already checked).
        source: The model path, for the message.
        texts: The probe texts.

    Raises:
        ModelError: ``"model <source> failed the swap probe (batch of <k>): ..."`` when
            a smaller batch fails to run, has the wrong shape, or scores differ by more
            than :data:`BATCH_SCORE_TOLERANCE`.
    """
    whole = np.asarray(scores, dtype=np.float64)
    for k in PROBE_BATCH_SIZES:
        if k >= len(texts):
            continue
        try:
            part = np.asarray(predict(list(texts[:k]))[0], dtype=np.float64)
        except Exception as exc:  # ORT raises its own types for a static batch dimension
            _refuse(source, f"batch of {k}", f"{type(exc).__name__}: {str(exc)[:300]}")
        if part.shape != (k,):
            _refuse(source, f"batch of {k}", f"got scores {part.shape}, expected ({k},)")
        gap = float(np.abs(part - whole[:k]).max())
        if not gap <= BATCH_SCORE_TOLERANCE:
            _refuse(source, f"batch of {k}", f"scores differ from the same probes in one batch of "
                    f"{len(texts)} by {gap:.3g} (> {BATCH_SCORE_TOLERANCE:g})")


def check_probe_vectors(
    run: Callable[[list[str]], npt.ArrayLike],
    *,
    width: int | None,
    source: str,
    normalized: bool = False,
    probabilities: str | None = None,
    texts: Sequence[str] = SWAP_PROBE_TEXTS,
) -> int:
    """Refuse a new version of a vector model (an encoder or a classifier) whose outputs on the
    probe texts are broken, then score the first probes again in smaller batches.

    Args:
        run: ``texts -> (k, width)`` float outputs of the new version, one row per text.
        width: The serving model's vector size (embedding dim or label count); None: not known,
            any width is taken.
        source: What was probed (the model path), for the message.
        normalized: Rows must be L2-normalised (to within 1e-3).
        probabilities: ``"softmax"``: every value in [0, 1] and each row sums to 1 (to within
            1e-3); ``"sigmoid"``: every value in [0, 1]; None: any finite values.
        texts: The probe texts (default :data:`SWAP_PROBE_TEXTS`).

    Returns:
        The width of the new version's rows.

    Raises:
        ModelError: ``"model <source> failed the swap probe (<check>): ..."`` where ``<check>``
            is ``shape``, ``non-finite output``, ``probability outside [0, 1]``,
            ``probabilities do not sum to 1``, ``embedding not L2-normalised``,
            ``identical outputs`` or ``batch of <k>``.
    """
    n = len(texts)
    try:
        out = np.asarray(run(list(texts)), dtype=np.float64)
    except Exception as exc:  # ORT raises its own types for a graph that does not run
        _refuse(source, "run", f"{type(exc).__name__}: {str(exc)[:300]}")
    if out.ndim != 2 or out.shape[0] != n or (width is not None and out.shape[1] != width):
        expected = f"({n}, {width})" if width is not None else f"({n}, dim)"
        _refuse(source, "shape", f"got {out.shape}, expected {expected} for {n} probe texts")
    _refuse_rows(source, "non-finite output", ~np.isfinite(out).all(axis=1), None, texts)
    if probabilities is not None:
        outside = ((out < 0.0) | (out > 1.0)).any(axis=1)
        _refuse_rows(source, "probability outside [0, 1]", outside, None, texts)
    if probabilities == "softmax":
        sums = out.sum(axis=1)
        off = np.abs(sums - 1.0) > _NORM_TOLERANCE
        _refuse_rows(source, "probabilities do not sum to 1", off, sums, texts)
    if normalized:
        norms = np.linalg.norm(out, axis=1)
        off = np.abs(norms - 1.0) > _NORM_TOLERANCE
        _refuse_rows(source, "embedding not L2-normalised", off, norms, texts)
    if n > 1 and float(np.abs(out - out[0]).max()) <= _EQUAL_TOLERANCE:
        _refuse(source, "identical outputs", f"all {n} probes got the same output")
    for k in PROBE_BATCH_SIZES:
        if k >= n:
            continue
        try:
            part = np.asarray(run(list(texts[:k])), dtype=np.float64)
        except Exception as exc:  # ORT raises its own types for a static batch dimension
            _refuse(source, f"batch of {k}", f"{type(exc).__name__}: {str(exc)[:300]}")
        if part.shape != (k, out.shape[1]):
            _refuse(source, f"batch of {k}", f"got {part.shape}, expected {(k, out.shape[1])}")
        gap = float(np.abs(part - out[:k]).max())
        if not gap <= BATCH_SCORE_TOLERANCE:
            _refuse(source, f"batch of {k}", f"outputs differ from the same probes in one batch of "
                    f"{n} by {gap:.3g} (> {BATCH_SCORE_TOLERANCE:g})")
    return int(out.shape[1])


def _refuse_rows(
    source: str, check: str, bad: npt.NDArray[np.bool_], values: npt.NDArray[np.float64] | None,
    texts: Sequence[str],
) -> None:
    """Refuse when any row is ``bad``, naming the first bad probe."""
    rows = np.flatnonzero(bad)
    if rows.size:
        first = int(rows[0])
        value = "" if values is None else f" ({values[first]:.6g})"
        _refuse(source, check, f"{rows.size} of {len(texts)} probes, first probe {first}{value}: "
                f"{texts[first][:40]!r}")


def _refuse(source: str, check: str, detail: str) -> NoReturn:
    raise ModelError(f"model {source} failed the swap probe ({check}): {detail}")
