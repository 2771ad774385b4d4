"""Comparing two runs' outputs: ids, labels, versions, scores within a tolerance, digests."""

from __future__ import annotations

import json
import random

import pytest

from pyflink_aisp.alignment import ScoreDiff, compare_outputs, multiset_digest
from pyflink_aisp.errors import DataError

SHA = "a" * 64


def _out(rid: str, score: float, label: str | None = None, version: str = SHA) -> bytes:
    label = label or ("fresh" if score >= 0.5 else "rotten")
    return json.dumps({"id": rid, "label": label, "score": score, "model_sha256": version}).encode()


def test_the_digest_ignores_order_and_counts_repeats() -> None:
    values = [_out(f"r{i}", i / 100) for i in range(100)]
    shuffled = values[:]
    random.Random(7).shuffle(shuffled)
    assert multiset_digest(values) == multiset_digest(shuffled)
    assert len(multiset_digest(values)) == 64
    assert multiset_digest(values + values[:1]) != multiset_digest(values)
    assert multiset_digest([]) == "0" * 64
    assert multiset_digest([values[0], values[1]]) != multiset_digest([values[0], values[2]])


def test_runs_that_agree_within_the_tolerance_are_the_same() -> None:
    a = [_out("r1", 0.25), _out("r2", 0.75), _out(7, 0.5)]  # type: ignore[arg-type]
    b = [_out("r2", 0.75 + 4e-6), _out("7", 0.5), _out("r1", 0.25 - 1e-6)]
    report = compare_outputs(a, b)
    assert report.ok and report.count_a == report.count_b == 3
    assert report.max_score_delta == pytest.approx(4e-6)
    assert report.digest_a != report.digest_b  # the bytes differ, the outputs agree
    assert report.lines()[-1] == "SAME"


def test_every_kind_of_difference_is_named_by_id() -> None:
    a = [_out("same", 0.5), _out("far", 0.3), _out("flip", 0.6), _out("ver", 0.1), _out("gone", 0.2),
         _out("twice", 0.9), _out("twice", 0.9)]
    b = [_out("same", 0.5), _out("far", 0.31), _out("flip", 0.6, label="rotten"),
         _out("ver", 0.1, version="b" * 64), _out("new", 0.4), _out("twice", 0.9)]
    report = compare_outputs(a, b)
    assert not report.ok
    assert (report.only_a, report.only_b) == (["gone"], ["new"])
    assert (report.duplicates_a, report.duplicates_b) == (["twice"], [])
    assert [d.id for d in report.differing] == ["far", "flip", "ver"]
    assert report.differing[1] == ScoreDiff("flip", ("fresh", 0.6, SHA), ("rotten", 0.6, SHA))
    text = "\n".join(report.lines())
    for rid in ("gone", "new", "twice", "far", "flip", "ver"):
        assert rid in text
    assert text.endswith("DIFFERENT")


def test_tolerance_bounds_and_bad_records() -> None:
    assert compare_outputs([_out("r", 0.5)], [_out("r", 0.5005)], tolerance=6e-4).ok
    assert not compare_outputs([_out("r", 0.5)], [_out("r", 0.5005)], tolerance=4e-4).ok
    with pytest.raises(ValueError, match="tolerance must be >= 0"):
        compare_outputs([], [], tolerance=-1)
    with pytest.raises(DataError, match=r"run b: an output record is not"):
        compare_outputs([_out("r", 0.5)], [b"not json"])
