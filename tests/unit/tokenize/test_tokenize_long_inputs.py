"""Long inputs cost a bounded prefix: no call tokenizes more than the hard bound of a text.

A spy between :class:`ArrowTokenizer` and the Rust tokenizer records the
length of every text handed to ``encode``/``encode_batch``/``encode_batch_fast``;
ids are checked against HF ``tokenizers`` run on the whole text with
truncation (slow here on purpose: only the operator path must be bounded).
No test asserts on time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, pre_tokenizers

from pyflink_aisp.tokenize import ArrowTokenizer, TokenizerConfig
from pyflink_aisp.tokenize._tokenizer import MAX_CHARS_PER_TOKEN, PRECUT_CHARS_PER_TOKEN

MAX_LENGTH = 128
BUDGET = MAX_LENGTH * PRECUT_CHARS_PER_TOKEN + 256  # 4,352 characters
HARD = MAX_LENGTH * MAX_CHARS_PER_TOKEN + 256  # 33,024 characters
CLS, SEP, UNK = 101, 102, 100


class _Spy:
    """Stands in for the Rust tokenizer and records the length of every text it is given."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner = inner
        self.lengths: list[int] = []

    def encode(self, text: str, *args: Any, **kwargs: Any) -> Any:
        self.lengths.append(len(text))
        return self.inner.encode(text, *args, **kwargs)

    def encode_batch(self, texts: list[str], *args: Any, **kwargs: Any) -> Any:
        self.lengths.extend(map(len, texts))
        return self.inner.encode_batch(texts, *args, **kwargs)

    def encode_batch_fast(self, texts: list[str], *args: Any, **kwargs: Any) -> Any:
        self.lengths.extend(map(len, texts))
        return self.inner.encode_batch_fast(texts, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _spied(tok: ArrowTokenizer) -> _Spy:
    spy = _Spy(tok._tokenizer)
    tok._tokenizer = spy  # type: ignore[assignment]
    tok._encode_batch = spy.encode_batch_fast
    return spy


def _reference(path: Path, max_length: int | None = MAX_LENGTH) -> Tokenizer:
    """HF ``tokenizers`` on the whole text, truncating like ``transformers`` (right, longest_first)."""
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    if max_length is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(max_length)
    return tokenizer


def _no_split_bpe(bpe_path: Path) -> Tokenizer:
    """The byte-level BPE file without its regex split: the pre-tokenizer keeps spaces inside tokens."""
    tokenizer = Tokenizer.from_file(str(bpe_path))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return tokenizer


@pytest.fixture(scope="module")
def english_900k(review_texts: list[str]) -> str:
    """900,000 characters of real reviews, concatenated."""
    text = " ".join(review_texts)
    while len(text) < 900_000:
        text = f"{text} {text}"
    return text[:900_000]


@pytest.fixture(scope="module")
def texts(english_900k: str) -> dict[str, str]:
    return {
        "english_900k": english_900k,
        "no_space_9m": "a" * 9_000_000,
        "cjk_2m": "中文评论" * 500_000,
    }


@pytest.fixture(scope="module")
def make_tokenizer(minilm_path: Path, bpe_path: Path) -> Callable[[str], ArrowTokenizer]:
    def make(kind: str, **config: Any) -> ArrowTokenizer:
        settings = TokenizerConfig(max_length=MAX_LENGTH, **config)
        if kind == "bpe_no_split":
            return ArrowTokenizer(_no_split_bpe(bpe_path), settings)
        return ArrowTokenizer.from_file(minilm_path if kind == "minilm" else bpe_path, settings)

    return make


@pytest.mark.parametrize("kind", ["minilm", "bpe", "bpe_no_split"])
@pytest.mark.parametrize("case", ["english_900k", "no_space_9m", "cjk_2m"])
def test_no_text_longer_than_the_hard_bound_reaches_the_rust_tokenizer(
    make_tokenizer: Callable[..., ArrowTokenizer], texts: dict[str, str], kind: str, case: str
) -> None:
    tok = make_tokenizer(kind)
    assert tok.spec.splits_on_whitespace is (kind != "bpe_no_split")
    spy = _spied(tok)
    count = tok.count_tokens(texts[case])
    assert spy.lengths and max(spy.lengths) <= HARD
    spy.lengths.clear()
    batch = tok.encode(["a short review", texts[case]])
    assert spy.lengths and max(spy.lengths) <= HARD
    rows = batch.input_ids.to_pylist()
    assert count == len(rows[1]) <= MAX_LENGTH
    assert batch.truncated.tolist() == [False, True]  # cut either way: content was dropped


@pytest.mark.parametrize("kind", ["minilm", "bpe"])
def test_900_kb_of_reviews_gives_the_whole_texts_first_tokens_from_the_precut_prefix(
    make_tokenizer: Callable[..., ArrowTokenizer],
    english_900k: str,
    minilm_path: Path,
    bpe_path: Path,
    kind: str,
) -> None:
    tok = make_tokenizer(kind)
    spy = _spied(tok)
    expected = _reference(minilm_path if kind == "minilm" else bpe_path).encode(english_900k).ids
    batch = tok.encode([english_900k])
    assert batch.input_ids.to_pylist() == [expected]
    assert tok.count_tokens(english_900k) == len(expected) == MAX_LENGTH
    assert max(spy.lengths) <= BUDGET  # real text stops at the cheap exact precut
    assert batch.truncated.tolist() == [True]


@pytest.mark.parametrize("kind", ["minilm", "bpe"])
def test_texts_just_under_and_over_the_precut_budget_and_the_hard_bound_are_exact(
    make_tokenizer: Callable[..., ArrowTokenizer],
    english_900k: str,
    minilm_path: Path,
    bpe_path: Path,
    kind: str,
) -> None:
    tok = make_tokenizer(kind)
    reference = _reference(minilm_path if kind == "minilm" else bpe_path)
    cases = [english_900k[:n] for n in (BUDGET - 1, BUDGET, BUDGET + 1, BUDGET + 50, 2 * BUDGET)]
    # Sparse texts: the precut prefix holds too few tokens, the whole text fits the hard bound.
    cases += [" " * (HARD - 20) + "late words", "x" * (HARD - 30) + " tail words here"]
    batch = tok.encode(cases)
    whole = reference.encode_batch(cases)
    expected = [e.ids for e in whole]
    assert batch.input_ids.to_pylist() == expected
    assert [tok.count_tokens(t) for t in cases] == list(map(len, expected))
    assert batch.truncated.tolist() == [bool(e.overflowing) for e in whole]  # HF: more than max_length
    assert batch.truncated[:5].all()


def test_cjk_without_spaces_gives_max_length_tokens_of_the_whole_text(
    make_tokenizer: Callable[..., ArrowTokenizer], texts: dict[str, str], minilm_path: Path, bpe_path: Path
) -> None:
    cjk = texts["cjk_2m"]
    for kind, path in (("minilm", minilm_path), ("bpe", bpe_path)):
        tok = make_tokenizer(kind)
        spy = _spied(tok)
        row = tok.encode([cjk]).input_ids.to_pylist()[0]
        assert len(row) == tok.count_tokens(cjk) == MAX_LENGTH
        assert max(spy.lengths) <= BUDGET  # cut inside the run at the precut budget, enough tokens
        # The whole 2M characters would take seconds; twice the hard bound is the same run.
        assert row == _reference(path).encode(cjk[: 2 * HARD]).ids


def test_9_mb_without_spaces_gives_the_whole_texts_ids(
    make_tokenizer: Callable[..., ArrowTokenizer], texts: dict[str, str], minilm_path: Path, bpe_path: Path
) -> None:
    no_space = texts["no_space_9m"]
    minilm = make_tokenizer("minilm")
    batch = minilm.encode([no_space])
    whole = _reference(minilm_path).encode_batch_fast([no_space])[0].ids
    assert batch.input_ids.to_pylist() == [whole] == [[CLS, UNK, SEP]]  # a word over 100 chars: [UNK]
    assert minilm.count_tokens(no_space) == 3
    assert batch.truncated.tolist() == [True]  # cut at the hard bound: content was dropped
    bpe = make_tokenizer("bpe")
    row = bpe.encode([no_space]).input_ids.to_pylist()[0]
    assert len(row) == MAX_LENGTH
    assert row == _reference(bpe_path).encode(no_space[: 2 * HARD]).ids  # the same run, cheap to tokenize


def test_text_cut_at_the_hard_bound_is_flagged_truncated_and_keeps_the_prefix_ids(
    make_tokenizer: Callable[..., ArrowTokenizer], minilm_path: Path
) -> None:
    tok = make_tokenizer("minilm")
    spy = _spied(tok)
    late = " " * (HARD + 10) + "late words"  # no token within the hard bound
    sparse = " " * 20_000 + "late words"  # too few tokens in the precut prefix, fits the hard bound
    batch = tok.encode(["short", late, None, sparse])
    assert max(spy.lengths) <= HARD
    rows = batch.input_ids.to_pylist()
    assert rows[1] == [CLS, SEP]  # the prefix's ids; HF, reading the whole text, has two more
    assert _reference(minilm_path).encode(late).ids == [CLS, *rows[3][1:-1], SEP] != rows[1]
    assert rows[3] == _reference(minilm_path).encode(sparse).ids
    assert batch.truncated.tolist() == [False, True, False, False]
    assert tok.count_tokens(late) == 2


def test_no_split_pre_tokenizer_is_bounded_and_flags_hard_cuts(
    make_tokenizer: Callable[..., ArrowTokenizer], bpe_path: Path
) -> None:
    tok = make_tokenizer("bpe_no_split")
    spy = _spied(tok)
    late = " " * (HARD + 10) + "late words"
    short = "A three-hour cinema master class."
    batch = tok.encode([short, late])
    assert max(spy.lengths) <= HARD
    assert batch.truncated.tolist() == [False, True]
    assert len(batch.input_ids.to_pylist()[1]) < MAX_LENGTH  # flagged by the hard cut, not by overflow
    reference = Tokenizer.from_str(_no_split_bpe(bpe_path).to_str())
    reference.enable_truncation(MAX_LENGTH)
    assert batch.input_ids.to_pylist()[0] == reference.encode(short).ids


def test_overflow_windows_tokenize_the_whole_text_but_count_tokens_stays_bounded(
    make_tokenizer: Callable[..., ArrowTokenizer], english_900k: str, minilm_path: Path
) -> None:
    text = english_900k[:50_000]  # over the hard bound, small enough to window whole
    tok = make_tokenizer("minilm", return_overflowing=True, stride=16)
    spy = _spied(tok)
    batch = tok.encode([text])
    assert max(spy.lengths) == len(text)  # every window of the whole text was asked for
    spy.lengths.clear()
    assert tok.count_tokens(text) == len(batch.input_ids.to_pylist()[0]) == MAX_LENGTH
    assert max(spy.lengths) <= BUDGET
    plain = _reference(minilm_path, None).encode(text, add_special_tokens=False).ids
    windows = batch.input_ids.to_pylist()
    assert windows[0] == [CLS, *plain[: MAX_LENGTH - 2], SEP]
    assert len(windows) > 1
