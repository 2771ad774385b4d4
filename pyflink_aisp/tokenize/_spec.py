"""Facts read from a ``tokenizer.json`` that the fast paths rely on.

- The type id of single-sequence tokens: BERT/RoBERTa/ByteLevel processors
  and templates whose pieces all carry one ``type_id`` give every token that
  id, so no per-token copy from Rust is needed.
- Whether the pre-tokenizer splits on whitespace: then the tokens of a text
  cut just before a whitespace run equal the first tokens of the whole text,
  which makes truncating a huge text cheap (only a prefix is tokenized).
- The pad id and pad type id (the file's ``padding`` section, else the id of a
  conventional pad token).

Schema: the serialisation of HF ``tokenizers`` (``Tokenizer.to_str()``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

__all__ = ["TokenizerSpec", "inspect_tokenizer"]

_PAD_TOKENS = ("[PAD]", "<pad>", "<|pad|>", "<PAD>")
_CONSTANT_PROCESSORS = {"BertProcessing": 0, "RobertaProcessing": 0, "ByteLevel": 0}
_WHITESPACE_PRE_TOKENIZERS = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}


@dataclass(frozen=True, kw_only=True)
class TokenizerSpec:
    """What :func:`inspect_tokenizer` found.

    Attributes:
        type_id_constant: Type id of every single-sequence token, or None if
            it varies (then type ids are read per token).
        splits_on_whitespace: The pre-tokenizer never lets a token span a
            whitespace run.
        pad_id: Default pad id.
        pad_type_id: Default pad type id.
        model_type: ``BPE``, ``WordPiece``, ``Unigram`` or ``WordLevel``.
    """

    type_id_constant: int | None
    splits_on_whitespace: bool
    pad_id: int
    pad_type_id: int
    model_type: str


def inspect_tokenizer(tokenizer: Tokenizer) -> TokenizerSpec:
    """Read the :class:`TokenizerSpec` of a loaded tokenizer."""
    raw = json.loads(tokenizer.to_str())
    padding = raw.get("padding") or {}
    pad_id = padding.get("pad_id")
    if pad_id is None:
        found = (tokenizer.token_to_id(t) for t in _PAD_TOKENS)
        pad_id = next((i for i in found if i is not None), 0)
    return TokenizerSpec(
        type_id_constant=_type_id_constant(raw.get("post_processor")),
        splits_on_whitespace=_splits_on_whitespace(raw.get("pre_tokenizer")),
        pad_id=int(pad_id),
        pad_type_id=int(padding.get("pad_type_id") or 0),
        model_type=str((raw.get("model") or {}).get("type", "")),
    )


def _type_id_constant(processor: dict[str, Any] | None) -> int | None:
    if processor is None:
        return 0
    kind = processor.get("type")
    if kind in _CONSTANT_PROCESSORS:
        return _CONSTANT_PROCESSORS[kind]
    if kind == "TemplateProcessing":
        ids = {next(iter(piece.values())).get("type_id", 0) for piece in processor.get("single", [])}
        return ids.pop() if len(ids) == 1 else (0 if not ids else None)
    if kind == "Sequence":
        constants = [_type_id_constant(p) for p in processor.get("processors", [])]
        templates = [p for p in processor.get("processors", []) if p.get("type") != "ByteLevel"]
        if len(templates) <= 1 and all(c is not None for c in constants):
            return _type_id_constant(templates[0]) if templates else 0
    return None


def _splits_on_whitespace(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return False
    kind = pre_tokenizer.get("type")
    if kind in _WHITESPACE_PRE_TOKENIZERS:
        return True
    if kind == "ByteLevel":
        return bool(pre_tokenizer.get("use_regex", True))
    if kind == "Metaspace":
        return bool(pre_tokenizer.get("split", True))
    if kind == "Sequence":
        return any(_splits_on_whitespace(p) for p in pre_tokenizer.get("pretokenizers", []))
    return False
