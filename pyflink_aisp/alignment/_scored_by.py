"""One kind of a route's records, for ``aisp verify --scored-by MODEL``.

A route's outputs say which models scored each record (``scored_by``: ``[{"model",
"model_sha256", ...}, ...]``, the answering model last). To check one kind of them against a
run of that model alone over the same input, :func:`select_scored_by` keeps run a's records
answered by the model and run b's records with the same ids; :func:`compare_outputs` then
compares the two as whole runs. Run b holds the other kinds' ids too (it scored every
record): those are left aside, and counted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pyflink_aisp.errors import DataError

__all__ = ["ScoredBySelection", "select_scored_by"]

_SCORED_BY = "scored_by"


@dataclass(frozen=True)
class ScoredBySelection:
    """What :func:`select_scored_by` kept of two runs.

    Attributes:
        model: The model whose answers were kept.
        a: Run a's raw values answered by ``model`` (in their order).
        b: Run b's raw values whose id is one of ``a``'s (in their order; an id written twice
            stays twice, for :func:`compare_outputs` to report).
        count_a / count_b: Records each run held before the selection.
    """

    model: str
    a: list[bytes]
    b: list[bytes]
    count_a: int
    count_b: int

    @property
    def left_aside_b(self) -> int:
        """Run b's records whose id is not in ``a``'s kept set."""
        return self.count_b - len(self.b)

    def line(self) -> str:
        """One human line, e.g. ``kept 412 of 900 in A (scored by onnx_sentiment); 488 of B's
        900 records left aside (ids not in A's kept set)``."""
        return (f"kept {len(self.a)} of {self.count_a} in A (scored by {self.model}); "
                f"{self.left_aside_b} of B's {self.count_b} records left aside (ids not in A's kept set)")


def _doc(value: bytes, side: str) -> tuple[str, dict[str, Any]]:
    """The record's id (as text) and its JSON object."""
    try:
        doc = json.loads(value)
        return str(doc["id"]), doc
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"run {side}: an output record is not {{\"id\", ...}} JSON: {value[:80]!r}") from exc


def _answering_model(doc: dict[str, Any]) -> str | None:
    """The last ``scored_by`` entry's model; None when the record has no ``scored_by`` list.

    A SQL route function's ``scored_by`` is a JSON string of the same list: read as the list.
    """
    trail = doc.get(_SCORED_BY)
    if isinstance(trail, str):
        try:
            trail = json.loads(trail)
        except ValueError:
            return None
    if not isinstance(trail, list) or not trail or not isinstance(trail[-1], dict):
        return None
    model = trail[-1].get("model")
    return model if isinstance(model, str) else None


def select_scored_by(a: Iterable[bytes], b: Iterable[bytes], model: str) -> ScoredBySelection:
    """Run a's records answered by ``model`` and run b's records of the same ids.

    Args:
        a: Raw output values of a route's run (JSON with ``id`` and ``scored_by``), any order.
        b: Raw output values of a run of ``model`` alone over the same input (JSON with ``id``).
        model: The registry name of the model, as ``scored_by`` spells it.

    Returns:
        The :class:`ScoredBySelection`.

    Raises:
        DataError: A value is not a JSON object with an ``id``; a record of a has no
            ``scored_by`` list naming a model (not a route's output); no record of a is
            answered by ``model`` (the models that answered are named; a typo would otherwise
            compare nothing with nothing and pass).
    """
    values_a, values_b = list(a), list(b)
    kept_a: list[bytes] = []
    kept_ids: set[str] = set()
    seen_models: set[str] = set()
    unlabelled: list[str] = []
    for value in values_a:
        rid, doc = _doc(value, "a")
        answered = _answering_model(doc)
        if answered is None:
            unlabelled.append(rid)
        elif answered == model:
            kept_a.append(value)
            kept_ids.add(rid)
        else:
            seen_models.add(answered)
    if unlabelled:
        raise DataError(f"run a: {len(unlabelled)} of {len(values_a)} records have no {_SCORED_BY} list "
                        f"naming a model (first ids: {', '.join(unlabelled[:5])}): --scored-by takes a "
                        "route's output topic as a")
    if not kept_a:
        scored = f"its records are scored by {', '.join(sorted(seen_models))}" if values_a else "it is empty"
        raise DataError(f"run a: no record is scored by {model!r} ({scored})")
    kept_b = [value for value in values_b if _doc(value, "b")[0] in kept_ids]
    return ScoredBySelection(model=model, a=kept_a, b=kept_b, count_a=len(values_a), count_b=len(values_b))
