"""Compare the outputs of two runs of a scoring job (``aisp verify``).

The two runtime modes batch records differently (a BATCH run sees whole
partitions, a stream what arrived by each bundle), and a model batch pads its
rows to its longest one, so scores may differ in the last float bits. Two runs
agree when they hold the same ids, each once, with the same label and model
version, and scores within a stated tolerance (:data:`DEFAULT_SCORE_TOLERANCE`).
Their exact bytes are summarised by :func:`multiset_digest`, which does not
depend on record order (a stream and a batch run write in different orders).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pyflink_aisp.errors import DataError

__all__ = ["DEFAULT_SCORE_TOLERANCE", "ScoreDiff", "VerifyReport", "compare_outputs", "multiset_digest"]

#: Largest |score difference| accepted between two runs: the same records scored in
#: other model batches differ by < 1e-6 on ONNX Runtime CPU (fp32); 1e-5 leaves room
#: for other kernels.
DEFAULT_SCORE_TOLERANCE = 1e-5


def multiset_digest(values: Iterable[bytes]) -> str:
    """Order-independent digest of records: the sum modulo 2**256 of their sha256
    (MSet-Add-Hash, Clarke et al., "Incremental Multiset Hash Functions and Their
    Application to Memory Integrity Checking", ASIACRYPT 2003). A record written twice
    counts twice.

    Returns:
        64 lower-case hex digits.
    """
    total = 0
    for value in values:
        total = (total + int.from_bytes(hashlib.sha256(value).digest(), "big")) % (1 << 256)
    return f"{total:064x}"


@dataclass(frozen=True)
class ScoreDiff:
    """One id whose outputs disagree: what each run wrote (label, score, model version)."""

    id: str
    a: tuple[Any, Any, Any]
    b: tuple[Any, Any, Any]


@dataclass(frozen=True)
class VerifyReport:
    """The comparison of two runs' outputs.

    Attributes:
        count_a / count_b: Records in each.
        only_a / only_b: Ids in one run only (sorted).
        duplicates_a / duplicates_b: Ids written more than once (sorted).
        differing: Ids with another label or model version, or a score further apart
            than the tolerance.
        max_score_delta: Largest |score difference| over the common ids.
        digest_a / digest_b: :func:`multiset_digest` of each run's raw values.
        tolerance: The score tolerance used.
    """

    count_a: int
    count_b: int
    only_a: list[str]
    only_b: list[str]
    duplicates_a: list[str]
    duplicates_b: list[str]
    differing: list[ScoreDiff] = field(default_factory=list)
    max_score_delta: float = 0.0
    digest_a: str = ""
    digest_b: str = ""
    tolerance: float = DEFAULT_SCORE_TOLERANCE

    @property
    def ok(self) -> bool:
        """Same ids, each once, same labels and versions, scores within the tolerance."""
        return not (self.only_a or self.only_b or self.duplicates_a or self.duplicates_b or self.differing)

    def lines(self, limit: int = 20) -> list[str]:
        """A human summary: counts, digests, then up to ``limit`` differing ids per kind."""
        out = [f"a: {self.count_a} records, digest {self.digest_a}",
               f"b: {self.count_b} records, digest {self.digest_b}",
               f"max |score delta| {self.max_score_delta:.3g} (tolerance {self.tolerance:g})"]
        kinds = (("only in a", self.only_a), ("only in b", self.only_b),
                 ("written twice in a", self.duplicates_a), ("written twice in b", self.duplicates_b))
        for title, ids in kinds:
            if ids:
                out.append(f"{title}: {len(ids)}: {', '.join(ids[:limit])}")
        for diff in self.differing[:limit]:
            out.append(f"differs: {diff.id}: a {diff.a} b {diff.b}")
        out.append("SAME" if self.ok else "DIFFERENT")
        return out


def _parse(values: list[bytes], side: str) -> tuple[dict[str, dict[str, Any]], list[str]]:
    docs: dict[str, dict[str, Any]] = {}
    counts: Counter[str] = Counter()
    for value in values:
        try:
            doc = json.loads(value)
            rid = str(doc["id"])
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"run {side}: an output record is not {{\"id\", ...}} JSON: "
                            f"{value[:80]!r}") from exc
        counts[rid] += 1
        docs[rid] = doc
    return docs, sorted(rid for rid, n in counts.items() if n > 1)


def _key(doc: dict[str, Any]) -> tuple[Any, Any, Any]:
    return doc.get("label"), doc.get("score"), doc.get("model_sha256")


def compare_outputs(
    a: Iterable[bytes], b: Iterable[bytes], *, tolerance: float = DEFAULT_SCORE_TOLERANCE
) -> VerifyReport:
    """Compare two runs' output values (JSON ``{"id", "label", "score", "model_sha256"}``).

    Args:
        a: Raw output values of run a (any order).
        b: Those of run b.
        tolerance: Largest accepted |score difference| (>= 0).

    Returns:
        The :class:`VerifyReport`; ``report.ok`` says whether they agree.

    Raises:
        DataError: A value is not a JSON object with an ``id``.
        ValueError: ``tolerance`` < 0.
    """
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    values_a, values_b = list(a), list(b)
    docs_a, dup_a = _parse(values_a, "a")
    docs_b, dup_b = _parse(values_b, "b")
    differing, max_delta = [], 0.0
    for rid in sorted(docs_a.keys() & docs_b.keys()):
        (label_a, score_a, version_a), (label_b, score_b, version_b) = _key(docs_a[rid]), _key(docs_b[rid])
        numeric = isinstance(score_a, (int, float)) and isinstance(score_b, (int, float))
        if numeric:
            delta = abs(float(score_a) - float(score_b))
        else:
            delta = 0.0 if score_a == score_b else float("inf")
        max_delta = max(max_delta, delta)
        if label_a != label_b or version_a != version_b or not delta <= tolerance:
            differing.append(ScoreDiff(rid, _key(docs_a[rid]), _key(docs_b[rid])))
    return VerifyReport(
        count_a=len(values_a), count_b=len(values_b),
        only_a=sorted(docs_a.keys() - docs_b.keys()), only_b=sorted(docs_b.keys() - docs_a.keys()),
        duplicates_a=dup_a, duplicates_b=dup_b, differing=differing, max_score_delta=max_delta,
        digest_a=multiset_digest(values_a), digest_b=multiset_digest(values_b), tolerance=tolerance)
