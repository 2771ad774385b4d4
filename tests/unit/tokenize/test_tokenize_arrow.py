"""ArrowTokenizer inputs and ragged outputs: input kinds, bad input, truncation, overflow, zero-copy."""

from __future__ import annotations

import itertools
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from tokenizers import Tokenizer

from pyflink_aisp.errors import ConfigError, ModelError, TokenizeError
from pyflink_aisp.tokenize import ArrowTokenizer, InvalidTextPolicy, TokenizedBatch, TokenizerConfig

CLS, SEP = 101, 102
TEXTS = ["A three-hour cinema master class.", None, "", "Hello, world!"]


@pytest.fixture(scope="module")
def tok(minilm_path: Path) -> ArrowTokenizer:
    return ArrowTokenizer.from_file(minilm_path, TokenizerConfig(max_length=128))


@pytest.fixture(scope="module")
def rust(minilm_path: Path) -> Tokenizer:
    """The plain Rust tokenizer, no truncation: the independent reference."""
    tokenizer = Tokenizer.from_file(str(minilm_path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def _rows(batch: TokenizedBatch) -> list[list[int] | None]:
    return batch.input_ids.to_pylist()


def test_output_columns_are_list_int32_sharing_one_offsets_buffer(tok: ArrowTokenizer) -> None:
    batch = tok.encode(TEXTS)
    for column in (batch.input_ids, batch.attention_mask, batch.token_type_ids):
        assert column.type == pa.list_(pa.int32())
        assert column.offsets.buffers()[1].address == batch.input_ids.offsets.buffers()[1].address
    assert batch.input_ids.null_count == 1
    record = batch.to_record_batch()
    assert record.schema.names == ["input_ids", "attention_mask", "token_type_ids", "source_row"]


@pytest.mark.parametrize(
    "make",
    [
        lambda t: pa.array(t, pa.string()),
        lambda t: pa.array(t, pa.large_string()),
        lambda t: pa.chunked_array([pa.array(t[:2]), pa.array(t[2:])]),
        lambda t: pa.array([None if x is None else x.encode() for x in t], pa.binary()),
        lambda t: pa.array([None if x is None else x.encode() for x in t], pa.large_binary()),
        lambda t: pa.array(t).dictionary_encode(),
        lambda t: pd.Series(t, dtype=object),
        lambda t: pd.Series(t, dtype="string[pyarrow]"),
        lambda t: pd.Series([np.nan if x is None else x for x in t], dtype=object),
        lambda t: list(t),
        lambda t: tuple(x.encode() if x else x for x in t),
    ],
    ids=[
        "string",
        "large_string",
        "chunked",
        "binary",
        "large_binary",
        "dictionary",
        "pandas",
        "pandas_arrow",
        "pandas_nan",
        "list",
        "tuple_bytes",
    ],
)
def test_every_input_kind_gives_the_same_ids(tok: ArrowTokenizer, rust: Tokenizer, make) -> None:
    rows = _rows(tok.encode(make(TEXTS)))
    assert rows[1] is None  # null in, null out
    assert rows[2] == [CLS, SEP]  # empty string: only the special tokens
    assert rows[0] == rust.encode(TEXTS[0]).ids and rows[3] == rust.encode(TEXTS[3]).ids


def test_null_rows_everywhere_and_all_null(tok: ArrowTokenizer) -> None:
    batch = tok.encode(pa.array([None, None], pa.string()))
    assert _rows(batch) == [None, None]
    assert batch.attention_mask.to_pylist() == [None, None] and batch.lengths.tolist() == [0, 0]
    assert _rows(tok.encode(pa.nulls(3))) == [None] * 3
    assert len(tok.encode([])) == 0
    assert not batch.truncated.any()


def test_special_tokens_off(minilm_path: Path, rust: Tokenizer) -> None:
    tok = ArrowTokenizer.from_file(minilm_path, TokenizerConfig(add_special_tokens=False))
    assert _rows(tok.encode(["", "Hello"])) == [[], rust.encode("Hello", add_special_tokens=False).ids]


def test_lowercasing_follows_the_tokenizer_file(tok: ArrowTokenizer) -> None:
    rows = _rows(tok.encode(["HELLO World", "hello world"]))
    assert rows[0] == rows[1]  # BertNormalizer lowercase=True in the MiniLM file


def test_non_string_column_is_a_clear_error(tok: ArrowTokenizer) -> None:
    with pytest.raises(TokenizeError, match="Arrow type int64"):
        tok.encode(pa.array([1, 2, 3]))
    with pytest.raises(TokenizeError, match="pandas dtype float64"):
        tok.encode(pd.Series([1.5, 2.5]))
    with pytest.raises(TokenizeError, match="row 1 is int"):
        tok.encode(["ok", 7])
    with pytest.raises(TokenizeError, match="got str"):
        tok.encode("not a column")


def test_invalid_utf8_names_the_row_or_nulls_it(minilm_path: Path, tok: ArrowTokenizer) -> None:
    data = [b"fine", None, b"\xff\xfe broken", b"also fine"]
    with pytest.raises(TokenizeError, match=r"row 2 is not valid UTF-8"):
        tok.encode(pa.array(data, pa.binary()))
    with pytest.raises(TokenizeError, match=r"row 2 is not valid UTF-8"):
        tok.encode(pd.Series(data, dtype=object))
    lenient = ArrowTokenizer.from_file(minilm_path, TokenizerConfig(invalid_text=InvalidTextPolicy.NULL))
    batch = lenient.encode(pa.array(data, pa.binary()))
    rows = _rows(batch)
    assert rows[1] is None and rows[2] is None and rows[0] and rows[3]
    assert batch.invalid_rows.tolist() == [2]  # for the dead-letter queue
    assert lenient.encode(data).invalid_rows.tolist() == [2]


def test_truncation_flags_only_rows_that_lost_tokens(minilm_path: Path, rust: Tokenizer) -> None:
    tok = ArrowTokenizer.from_file(minilm_path, TokenizerConfig(max_length=10))
    exact = "one two three four five six seven eight"  # 8 tokens + 2 specials = 10
    longer = exact + " nine"
    assert len(rust.encode(exact).ids) == 10
    batch = tok.encode([exact, longer, "short", None])
    assert batch.truncated.tolist() == [False, True, False, False]
    assert batch.lengths.tolist() == [10, 10, 3, 0]
    assert _rows(batch)[1] == rust.encode(exact).ids  # [SEP] kept after truncation


def test_overflow_windows_map_back_to_their_rows(minilm_path: Path, rust: Tokenizer) -> None:
    max_length, stride = 12, 3
    tok = ArrowTokenizer.from_file(
        minilm_path, TokenizerConfig(max_length=max_length, stride=stride, return_overflowing=True)
    )
    texts = [" ".join(f"w{i}" for i in range(n)) for n in (3, 40, 0)]
    texts.insert(1, None)
    batch = tok.encode(texts)
    assert batch.truncated.tolist() == [False, False, True, False]
    assert batch.source_rows.tolist()[:2] == [0, 1] and batch.source_rows[-1] == 3
    rows = _rows(batch)
    for source in (0, 2):
        windows = [rows[i] for i in np.flatnonzero(batch.source_rows == source)]
        content = [w[1:-1] for w in windows]  # strip [CLS] ... [SEP]
        assert all(w[0] == CLS and w[-1] == SEP and len(w) <= max_length for w in windows)
        rebuilt = content[0] + [t for c in content[1:] for t in c[stride:]]  # windows overlap by `stride`
        assert rebuilt == rust.encode(texts[source], add_special_tokens=False).ids
        for previous, current in itertools.pairwise(content):
            assert previous[-stride:] == current[:stride]
    assert rows[1] is None


def test_a_1_mib_text_is_truncated_from_a_bounded_prefix(minilm_path: Path, rust: Tokenizer) -> None:
    words = ("stream", "tokenizer", "arrow", "flink,", "reviews.", "Ünïcode")
    huge = " ".join(words[i % len(words)] for i in range(200_000))[: 2**20]
    assert len(huge.encode()) >= 2**20 - 16
    tok = ArrowTokenizer.from_file(minilm_path, TokenizerConfig(max_length=128))
    seen: list[int] = []
    inner = tok._encode_batch
    tok._encode_batch = lambda texts, **kw: seen.extend(map(len, texts)) or inner(texts, **kw)  # spy
    tracemalloc.start()
    batch = tok.encode(["short one", huge])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert batch.truncated.tolist() == [False, True]
    assert _rows(batch)[1] == [*rust.encode(huge).ids[:127], SEP]  # exactly the whole text's first tokens
    assert max(seen) <= 128 * 32 + 256  # only a prefix reached the Rust tokenizer
    assert peak < 4 * 2**20  # Python-side memory: the prefix and its ids, not 1 MiB of tokens


def test_long_text_without_spaces_or_cut_too_short_falls_back_to_the_whole_text_within_the_hard_bound(
    minilm_path: Path, rust: Tokenizer
) -> None:
    tok = ArrowTokenizer.from_file(minilm_path, TokenizerConfig(max_length=16))  # bounds 768, 4352 chars
    no_space = "x" * 4_000  # one "word": cut inside it, too few tokens
    sparse = "a " + " " * 3_000 + "b " * 40  # the prefix is all spaces: too few tokens
    batch = tok.encode([no_space, sparse])
    assert _rows(batch) == [[CLS, 100, SEP], [*rust.encode(sparse).ids[:15], SEP]]  # 100: [UNK]
    assert batch.truncated.tolist() == [False, True]


def test_flat_ids_and_offsets_are_zero_copy_views_of_the_arrow_buffers(tok: ArrowTokenizer) -> None:
    batch = tok.encode(TEXTS)
    ids, offsets = batch.flat_ids, batch.offsets
    assert ids.dtype == np.int32 and offsets.dtype == np.int32
    assert ids.__array_interface__["data"][0] == batch.input_ids.values.buffers()[1].address
    assert offsets.__array_interface__["data"][0] == batch.input_ids.offsets.buffers()[1].address
    assert not ids.flags.owndata and not offsets.flags.owndata
    values = batch.input_ids.values
    assert values.to_numpy(zero_copy_only=True).__array_interface__["data"][0] == values.buffers()[1].address


def test_load_errors(tmp_path: Path, minilm_path: Path) -> None:
    with pytest.raises(ModelError, match="cannot load tokenizer"):
        ArrowTokenizer.from_file(tmp_path / "missing.json")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelError):
        ArrowTokenizer.from_file(tmp_path)  # a directory holding a tokenizer.json
    with pytest.raises(ConfigError, match="no room"):
        ArrowTokenizer.from_file(minilm_path, TokenizerConfig(max_length=2))
    with pytest.raises(ConfigError, match="stride"):
        ArrowTokenizer.from_file(
            minilm_path, TokenizerConfig(max_length=8, stride=6, return_overflowing=True)
        )


def test_directory_and_tokenizer_object_give_the_same_ids(minilm_path: Path) -> None:
    from_dir = ArrowTokenizer.from_file(minilm_path.parent).encode(TEXTS)
    original = Tokenizer.from_file(str(minilm_path))
    from_object = ArrowTokenizer(original, TokenizerConfig(max_length=4)).encode(TEXTS)
    assert original.truncation["max_length"] == 128  # the caller's tokenizer is not changed
    assert _rows(from_object)[0] == [*_rows(from_dir)[0][:3], SEP]


def test_count_tokens_equals_the_encoded_row_length(minilm_path, review_texts):
    from pyflink_aisp.tokenize import ArrowTokenizer, TokenizerConfig

    tok = ArrowTokenizer.from_file(minilm_path, TokenizerConfig(max_length=16))
    texts = [*review_texts[:50], "", "word " * 100]
    rows = tok.encode(texts).input_ids.to_pylist()
    assert [tok.count_tokens(t) for t in texts] == [len(r) for r in rows]
    assert tok.count_tokens("") == 2 and tok.count_tokens("word " * 100) == 16
    with pytest.raises(TokenizeError):
        tok.count_tokens(b"bytes")
